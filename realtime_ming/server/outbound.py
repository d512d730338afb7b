"""What waits to be sent on one realtime connection, bounded (server/connection.py's writer drains it).

Frames waiting for the writer are bounded in bytes (a frame counts until its send completed) and in number;
`Outbound.put` never blocks: past a bound the client is not reading, and the session ends (`SessionEnded`,
1008). Echoes of stored items are queued as events (`Echo`) and serialised just before they are sent: the
client's image data URLs they carry are the conversation's own strings, counted apart (`max_echo_bytes`).
`Close` is the writer's last item: flush what precedes it, then close with its code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from dataclasses import dataclass

from websockets.frames import CloseCode

from ..protocol.codec import serialise
from ..protocol.dialect import Dialect
from ..protocol.events import ServerEvent
from ..protocol.items import ConversationItem, InputImage, MessageItem
from ..protocol.server_events import ConversationItemAdded, ConversationItemDone, ConversationItemRetrieved
from ..session.runner import SessionClosing

__all__ = ["ECHOES", "Close", "Echo", "Outbound", "SessionEnded", "echo_bytes"]


class SessionEnded(SessionClosing):
    """A task saw the session end; `code` None = the socket is already closed."""

    def __init__(self, code: CloseCode | None, reason: str = "") -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Close:
    """Writer sentinel: flush everything queued before it, then close with `code`."""

    code: CloseCode
    reason: str


ECHOES = (ConversationItemAdded, ConversationItemDone, ConversationItemRetrieved)


def echo_bytes(item: ConversationItem) -> tuple[int, int]:
    """(bytes of the item's image data URLs, which are the conversation's own strings; bytes of its
    other strings), as `sys.getsizeof` counts them."""
    shared = own = 0
    parts = item.content if isinstance(item, MessageItem) else (item,)
    for part in parts:
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            if isinstance(value, str):
                size = sys.getsizeof(value)
                if isinstance(part, InputImage) and f.name == "image_url":
                    shared += size
                else:
                    own += size
    return shared, own


@dataclass(frozen=True, slots=True)
class Echo:
    """An item event serialised by the writer just before it is sent (see the module doc)."""

    event: ServerEvent
    dialect: Dialect
    timing_events: bool
    shared: int  # bytes the conversation holds anyway (the client's image data URLs)
    own: int  # bytes only this event holds, plus the frame's envelope

    def frame(self) -> str | None:
        return serialise(self.event, self.dialect, timing_events=self.timing_events)


class Outbound:
    """Frames waiting for the writer, bounded in bytes (a frame counts until its send completed) and in
    number. `put` never blocks: past a bound the client is not reading, and the session ends (1008).
    An `Echo` counts its own bytes against `max_bytes` and its shared ones against `maxecho_bytes`."""

    _ENVELOPE = 256  # an echo's JSON keys and ids, beyond its strings

    def __init__(self, max_bytes: int, max_frames: int, maxecho_bytes: int) -> None:
        self._queue: asyncio.Queue[str | Echo | Close] = asyncio.Queue()
        self._max_bytes, self._max_frames, self._maxecho_bytes = max_bytes, max_frames, maxecho_bytes
        self.nbytes = 0  # memory held by queued and in-flight frames
        self.echo_bytes = 0  # conversation strings referenced by queued and in-flight echoes

    def echo(self, event: ServerEvent, dialect: Dialect, timing_events: bool) -> Echo:
        """`event` (an item event) as a deferred frame."""
        shared, own = echo_bytes(event.item)  # type: ignore[attr-defined]
        return Echo(event, dialect, timing_events, shared, own + self._ENVELOPE)

    def _refuse(self, held: int, size: int, limit: int, what: str) -> None:
        raise SessionEnded(
            CloseCode.POLICY_VIOLATION,
            f"client is not reading: {held + size} {what} / {self._queue.qsize() + 1} events "
            f"to send exceed the limit of {limit} / {self._max_frames}",
        )

    def put(self, item: str | Echo | Close) -> None:
        if isinstance(item, Close):
            self._queue.put_nowait(item)
            return
        size, shared = (sys.getsizeof(item), 0) if isinstance(item, str) else (item.own, item.shared)
        full = self._queue.qsize() >= self._max_frames
        if self.nbytes and (self.nbytes + size > self._max_bytes or full):
            self._refuse(self.nbytes, size, self._max_bytes, "bytes")
        if shared and self.echo_bytes and (self.echo_bytes + shared > self._maxecho_bytes or full):
            self._refuse(self.echo_bytes, shared, self._maxecho_bytes, "image bytes")
        self.nbytes += size
        self.echo_bytes += shared
        self._queue.put_nowait(item)

    async def get(self) -> str | Echo | Close:
        return await self._queue.get()

    def sent(self, item: str | Echo) -> None:
        if isinstance(item, str):
            self.nbytes -= sys.getsizeof(item)
        else:
            self.nbytes -= item.own
            self.echo_bytes -= item.shared
