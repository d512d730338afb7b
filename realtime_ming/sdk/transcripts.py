"""User transcripts as the SDK sees them: `conversation.item.input_audio_transcription.*` by item id.

`Transcripts` is fed every server event the agent's transport delivers (before the event is queued
for `recv()`), so `agent.transcripts.get(item_id)` is current whatever the application reads, and
`await agent.transcripts.wait(item_id)` returns the final transcript of one user audio item (or raises
`TranscriptionFailed` with the server's error). Events still arrive in the stream as usual.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..protocol.events import ServerEvent
from ..protocol.responses import ErrorDetail
from ..protocol.server_events import (
    ConversationItemDeleted,
    ConversationItemInputAudioTranscriptionCompleted,
    ConversationItemInputAudioTranscriptionDelta,
    ConversationItemInputAudioTranscriptionFailed,
)
from .errors import RealtimeError

__all__ = ["Transcript", "TranscriptionFailed", "Transcripts"]

MAX_KEPT = 1024  # transcripts remembered (oldest forgotten first); the server bounds its conversation too


class TranscriptionFailed(RealtimeError):
    """The server could not transcribe a user audio item (`...input_audio_transcription.failed`)."""

    def __init__(self, item_id: str, error: ErrorDetail) -> None:
        super().__init__(f"transcription of {item_id} failed: {error.code}: {error.message}")
        self.item_id, self.error = item_id, error


@dataclass(slots=True)
class Transcript:
    """One user audio item's transcript: `text` so far (final once `done`), or the `error` it failed with."""

    item_id: str
    text: str = ""
    done: bool = False
    error: ErrorDetail | None = None


class Transcripts(Mapping[str, Transcript]):
    """Transcripts by user item id, in order of arrival (a read-only mapping plus `wait`)."""

    def __init__(self) -> None:
        self._by_item: dict[str, Transcript] = {}
        self._waiters: dict[str, list[asyncio.Future[str]]] = {}

    def __getitem__(self, item_id: str) -> Transcript:
        return self._by_item[item_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_item)

    def __len__(self) -> int:
        return len(self._by_item)

    def observe(self, event: ServerEvent) -> None:
        """Transport side: account one server event (others are ignored)."""
        if isinstance(event, ConversationItemInputAudioTranscriptionDelta):
            self._entry(event.item_id).text += event.delta
        elif isinstance(event, ConversationItemInputAudioTranscriptionCompleted):
            entry = self._entry(event.item_id)
            entry.text, entry.done = event.transcript, True
            self._resolve(entry)
        elif isinstance(event, ConversationItemInputAudioTranscriptionFailed):
            entry = self._entry(event.item_id)
            entry.error, entry.done = event.error, True
            self._resolve(entry)
        elif isinstance(event, ConversationItemDeleted):
            self._by_item.pop(event.item_id, None)

    async def wait(self, item_id: str, *, timeout_s: float | None = 60.0) -> str:
        """The final transcript of `item_id`; raises `TranscriptionFailed`, or `TimeoutError` after `timeout_s`.

        Events must keep flowing: read the agent's events meanwhile (another task), or the bounded event queue
        stops the transport."""
        entry = self._by_item.get(item_id)
        if entry is None or not entry.done:
            future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(item_id, []).append(future)
            try:
                async with asyncio.timeout(timeout_s):
                    await asyncio.shield(future)
            finally:
                waiters = self._waiters.get(item_id, [])
                if future in waiters:
                    waiters.remove(future)
            entry = self._by_item[item_id]
        if entry.error is not None:
            raise TranscriptionFailed(item_id, entry.error)
        return entry.text

    def _entry(self, item_id: str) -> Transcript:
        entry = self._by_item.get(item_id)
        if entry is None:
            if len(self._by_item) >= MAX_KEPT:
                del self._by_item[next(iter(self._by_item))]
            entry = self._by_item[item_id] = Transcript(item_id)
        return entry

    def _resolve(self, entry: Transcript) -> None:
        for future in self._waiters.pop(entry.item_id, []):
            if not future.done():
                future.set_result(entry.text)
