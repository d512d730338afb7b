"""The `oai-events` data channel of a WebRTC call as the session's `Transport` (server/transport.py).

Events are JSON text messages, as on the WebSocket. What differs:

* The channel opens after the answer (ICE, DTLS, SCTP): `send` waits for it; one that has not opened within
  `connect_timeout_s`, or a peer connection that fails or closes, ends the call (`TransportClosed`).
* SCTP has no flow control toward this side's reader: messages the session has not taken yet are bounded
  (`max_pending` messages or `max_pending_bytes`); a client that floods past them is cut off.
* A message cannot exceed what the peer said it receives (`a=max-message-size`, 64 KiB when unsaid; Chromium
  takes 256 KiB). An item event over it is sent without its base64 `audio` (the audio went over the media
  track; transcripts stay); any other event over it becomes an `error` (`event_too_large`) naming it.
* Sending waits while more than `HIGH_WATER_BYTES` are buffered in SCTP (a client that stops reading is then
  caught by the writer's send timeout, as on the WebSocket). Closing flushes what is buffered (bounded by
  the caller), then closes the peer connection: a WebRTC call has no close code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

from aiortc import RTCDataChannel, RTCPeerConnection

from ..protocol.codec import serialise
from ..protocol.dialect import Dialect
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.server_events import Error
from ..server.transport import TransportClosed

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "EVENTS_LABEL", "HIGH_WATER_BYTES", "DataChannelTransport", "peer_max_message"]

log = logging.getLogger(__name__)

EVENTS_LABEL = "oai-events"
DEFAULT_MAX_MESSAGE_BYTES = 65536  # RFC 8841: a peer that states no a=max-message-size takes 64 KiB
UNLIMITED_MESSAGE_BYTES = 16 * 2**20  # a peer that states 0 (any size): this side still keeps it sane
HIGH_WATER_BYTES = 1 * 2**20  # SCTP send buffer above which `send` waits for it to drain
_ITEM_EVENTS = ("conversation.item.added", "conversation.item.done", "conversation.item.retrieved",
                "response.output_item.done")
_MAX_MESSAGE = re.compile(r"^a=max-message-size:(\d+)\s*$", re.MULTILINE)


def peer_max_message(offer_sdp: str) -> int:
    """The largest message the offering peer receives (its `a=max-message-size`)."""
    found = _MAX_MESSAGE.search(offer_sdp)
    if found is None:
        return DEFAULT_MAX_MESSAGE_BYTES
    size = int(found.group(1))
    return UNLIMITED_MESSAGE_BYTES if size == 0 else min(size, UNLIMITED_MESSAGE_BYTES)


def _without_audio(obj: dict[str, Any]) -> dict[str, Any]:
    """An item event with the base64 `audio` of its content parts left out."""
    item = obj.get("item")
    if isinstance(item, dict) and isinstance(item.get("content"), list):
        content = [{k: v for k, v in part.items() if k != "audio"} if isinstance(part, dict) else part
                   for part in item["content"]]
        obj = {**obj, "item": {**item, "content": content}}
    return obj


class DataChannelTransport:
    """One call's event channel (attach the `oai-events` channel when the peer opens it)."""

    def __init__(self, pc: RTCPeerConnection, *, max_message_bytes: int, connect_timeout_s: float,
                 max_pending: int = 1024, max_pending_bytes: int = 32 * 2**20) -> None:
        self._pc = pc
        self._max_message = max_message_bytes
        self._max_pending, self._max_pending_bytes = max_pending, max_pending_bytes
        self._incoming: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self._pending_bytes = 0
        self._channel: RTCDataChannel | None = None
        self._opened = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self.closed = False
        self.reason = ""  # why the call ended, for the log
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(connect_timeout_s, self._connect_timeout, connect_timeout_s)

    @property
    def is_open(self) -> bool:
        return self._channel is not None and self._channel.readyState == "open" and not self.closed

    def attach(self, channel: RTCDataChannel) -> bool:
        """Take the peer's `oai-events` channel (False: another label, or one is attached already)."""
        if channel.label != EVENTS_LABEL or self._channel is not None or self.closed:
            return False
        self._channel = channel
        channel.bufferedAmountLowThreshold = HIGH_WATER_BYTES // 2
        channel.on("message", self._on_message)
        channel.on("close", lambda: self.end("the client closed the data channel"))
        channel.on("bufferedamountlow", self._drained.set)
        if channel.readyState == "open":
            self._on_open()
        else:
            channel.on("open", self._on_open)
        return True

    def _on_open(self) -> None:
        self._timer.cancel()
        self._opened.set()

    def _connect_timeout(self, timeout_s: float) -> None:
        if not self._opened.is_set():
            self.end(f"no data channel within {timeout_s:g} s of the answer")

    def _on_message(self, message: str | bytes) -> None:
        if self.closed:
            return
        size = len(message)
        if self._incoming.qsize() >= self._max_pending or self._pending_bytes + size > self._max_pending_bytes:
            self.end("the client floods the data channel faster than the session takes events")
            return
        self._pending_bytes += size
        self._incoming.put_nowait(message)

    def end(self, reason: str) -> None:
        """The call is over (peer gone, timeout, flood): wake every waiter; close the peer connection."""
        if self.closed:
            return
        self.closed, self.reason = True, reason
        self._timer.cancel()
        self._incoming.put_nowait(None)
        self._opened.set()
        self._drained.set()
        asyncio.ensure_future(self._pc.close())

    async def recv(self) -> str | bytes:
        message = await self._incoming.get()
        if message is None:
            self._incoming.put_nowait(None)  # every later recv ends too
            raise TransportClosed
        self._pending_bytes -= len(message)
        return message

    async def send(self, frame: str) -> None:
        await self._opened.wait()
        channel = self._channel
        if self.closed or channel is None or channel.readyState != "open":
            raise TransportClosed
        data = self._fit(frame)
        while channel.bufferedAmount > HIGH_WATER_BYTES and not self.closed:
            self._drained.clear()
            await self._drained.wait()
        if self.closed or channel.readyState != "open":
            raise TransportClosed
        channel.send(data)

    def _fit(self, frame: str) -> str:
        """`frame`, or what is sent in its place when it is over the peer's message size."""
        size = len(frame.encode())
        if size <= self._max_message:
            return frame
        obj = json.loads(frame)
        if obj.get("type") in _ITEM_EVENTS:
            smaller = json.dumps(_without_audio(obj), ensure_ascii=False, separators=(",", ":"))
            if len(smaller.encode()) <= self._max_message:
                return smaller
        log.warning("%s event of %d bytes is over the peer's data channel message size (%d): sent an error instead",
                    obj.get("type"), size, self._max_message)
        error = ProtocolError(ErrorCode.EVENT_TOO_LARGE, event_type=str(obj.get("type")), num_bytes=size,
                              max_bytes=self._max_message)
        text = serialise(Error.from_protocol_error(error), Dialect.GA)
        assert text is not None
        return text

    async def close(self, code: int, reason: str) -> None:
        """Flush what SCTP still buffers (the caller bounds the time), then close the peer connection."""
        channel = self._channel
        while channel is not None and channel.readyState == "open" and channel.bufferedAmount and not self.closed:
            await asyncio.sleep(0.02)
        self.end(reason or "closed")
        await self._pc.close()

    def abort(self) -> None:
        self.end("aborted")
