"""One response gathered from the event stream: text, decoded audio, client-side timings, the events.

`TurnCollector` is fed every event `collect_turn` reads; it follows the first response it sees
(by id) until that response's `response.done` — and, when the session opted in to timing events,
the `realtime_ming.response.timings` that follows it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..protocol.events import ServerEvent
from ..protocol.responses import ResponseStatus, StatusDetails, Usage
from ..protocol.server_events import (
    Error,
    RealtimeMingResponseTimings,
    ResponseCreated,
    ResponseDone,
    ResponseOutputAudioDelta,
    ResponseOutputAudioTranscriptDelta,
    ResponseOutputAudioTranscriptDone,
    ResponseOutputItemAdded,
    ResponseOutputTextDelta,
    ResponseOutputTextDone,
)
from ..protocol.values import AudioFormat
from .audio import decode_audio_deltas, save_wav

__all__ = ["TurnCollector", "TurnResult", "TurnTimings"]


@dataclass(frozen=True, slots=True)
class TurnTimings:
    """Client-side seconds after the collection origin (the `collect_turn` call, or its `since`).

    `server_ms` is the server's own `realtime_ming.response.timings` (ms after the end of user
    input) when the session set `timing_events`, else None.
    """

    response_created_s: float | None
    first_text_s: float | None
    first_audio_s: float | None
    done_s: float
    server_ms: Mapping[str, float] | None = None


@dataclass(frozen=True, slots=True)
class TurnResult:
    """A finished response: its text (or audio transcript) and its audio as float32 [n]."""

    response_id: str
    status: ResponseStatus
    status_details: StatusDetails | None
    item_id: str | None
    text: str
    audio: np.ndarray  # [n] float32 at sample_rate_hz; empty for text-only responses
    sample_rate_hz: int
    usage: Usage | None
    timings: TurnTimings
    events: tuple[ServerEvent, ...]  # every event read while collecting, in order

    @property
    def duration_s(self) -> float:
        """Length of the audio in seconds."""
        return self.audio.size / self.sample_rate_hz

    @property
    def errors(self) -> tuple[Error, ...]:
        """The `error` events read while collecting (only when `raise_on_error` is off)."""
        return tuple(e for e in self.events if isinstance(e, Error))

    def save_wav(self, path: str | os.PathLike) -> Path:
        """Write the audio as 16-bit PCM WAV at `sample_rate_hz` (24 kHz, 44.1 kHz, …)."""
        return save_wav(path, self.audio, self.sample_rate_hz)


def _response_id_of(event: ServerEvent) -> str | None:
    if isinstance(event, ResponseCreated | ResponseDone):
        return event.response.id
    return getattr(event, "response_id", None)


class TurnCollector:
    """Accumulates one response from events fed in order with `add(event, now)`.

    `origin` and `now` are `time.monotonic()` seconds; `output_format` decodes audio when the
    response's own `response.created` was read before collecting began.
    """

    def __init__(self, origin: float, output_format: AudioFormat, *, expect_timings: bool) -> None:
        self._origin = origin
        self._format = output_format
        self._expect_timings = expect_timings
        self._response_id: str | None = None
        self._events: list[ServerEvent] = []
        self._deltas: list[str] = []
        self._text: list[str] = []
        self._final_text: str | None = None
        self._item_id: str | None = None
        self._created_s: float | None = None
        self._first_text_s: float | None = None
        self._first_audio_s: float | None = None
        self._done: ResponseDone | None = None
        self._done_s = 0.0
        self._server_ms: Mapping[str, float] | None = None

    @property
    def is_complete(self) -> bool:
        """Whether the followed response is done (and its timings read, when expected)."""
        return self._done is not None and (not self._expect_timings or self._server_ms is not None)

    def add(self, event: ServerEvent, now: float) -> None:
        """Record one event (events of other responses are kept in `events` only)."""
        self._events.append(event)
        response_id = _response_id_of(event)
        if response_id is None or self._done is not None and not isinstance(event, RealtimeMingResponseTimings):
            return
        if self._response_id is None:
            self._response_id = response_id
        if response_id != self._response_id:
            return
        elapsed = now - self._origin
        if isinstance(event, ResponseCreated):
            self._created_s = elapsed
            self._format = event.response.output_format
        elif isinstance(event, ResponseOutputItemAdded):
            self._item_id = event.item.id
        elif isinstance(event, ResponseOutputAudioDelta):
            self._first_audio_s = elapsed if self._first_audio_s is None else self._first_audio_s
            self._deltas.append(event.delta)
        elif isinstance(event, ResponseOutputTextDelta | ResponseOutputAudioTranscriptDelta):
            self._first_text_s = elapsed if self._first_text_s is None else self._first_text_s
            self._text.append(event.delta)
        elif isinstance(event, ResponseOutputTextDone):
            self._final_text = event.text
        elif isinstance(event, ResponseOutputAudioTranscriptDone):
            self._final_text = event.transcript
        elif isinstance(event, ResponseDone):
            self._done, self._done_s = event, elapsed
        elif isinstance(event, RealtimeMingResponseTimings):
            self._server_ms = dict(event.timings)

    def result(self) -> TurnResult:
        """The collected turn; raises `RuntimeError` before `response.done` was added."""
        if self._done is None:
            raise RuntimeError("the response is not done yet")
        response = self._done.response
        return TurnResult(
            response_id=response.id,
            status=response.status,
            status_details=response.status_details,
            item_id=self._item_id,
            text=self._final_text if self._final_text is not None else "".join(self._text),
            audio=decode_audio_deltas(self._deltas, self._format),
            sample_rate_hz=self._format.sample_rate_hz,
            usage=response.usage,
            timings=TurnTimings(self._created_s, self._first_text_s, self._first_audio_s, self._done_s,
                                self._server_ms),
            events=tuple(self._events),
        )
