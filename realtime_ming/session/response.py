"""One response on the wire: `response.created` … deltas … every `.done`, then `response.done`.

`ActiveResponse` turns engine output (text deltas, 44.1 kHz audio, stage marks) into the GA
event sequence of docs/protocol.md §5.2 and guarantees that `finish` emits each pending
`.done` exactly once, for completed, cancelled and failed responses alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ..engine.api import FailureCode, Stage, TurnFailed
from ..protocol.error_codes import ErrorCode
from ..protocol.events import ServerEvent
from ..protocol.items import ItemStatus, OutputAudio, OutputText
from ..protocol.responses import (
    ErrorDetail,
    Response,
    ResponseStatus,
    StatusDetails,
    StatusReason,
    Usage,
)
from ..protocol.server_events import (
    ConversationItemAdded,
    ConversationItemDone,
    RealtimeMingResponseTimings,
    ResponseContentPartAdded,
    ResponseContentPartDone,
    ResponseCreated,
    ResponseDone,
    ResponseOutputAudioDelta,
    ResponseOutputAudioDone,
    ResponseOutputAudioTranscriptDelta,
    ResponseOutputAudioTranscriptDone,
    ResponseOutputItemAdded,
    ResponseOutputItemDone,
    ResponseOutputTextDelta,
    ResponseOutputTextDone,
)
from ..protocol.values import AudioFormat, MaxOutputTokens, Modality
from .actions import ResponseFinished
from .audio_io import OutputEncoder
from .conversation import AssistantItem, Conversation
from .mcp_calls import McpTarget
from .playback import PlaybackClock
from .tools import ResponseCalls

__all__ = ["ActiveResponse", "ResponseSpec", "failure_error"]

_ITEM_STATUS = {ResponseStatus.COMPLETED: ItemStatus.COMPLETED}  # anything else: incomplete
# Audio this far ahead of real time (sent minus the time since the first delta) goes out one delta per engine chunk
# instead of `output_frame_ms` frames: the client has seconds buffered, and a fast engine (20x real time on GPUs)
# would otherwise queue ~25 frames a second of audio, past the connection's frame cap on a slow reader.
AHEAD_WHOLE_CHUNKS_S = 2.0

# engine failure cause -> the `response.done` error code (the engine's own message stays in the server log,
# except for INVALID_PROMPT, whose detail describes the client's own content)
_FAILURE_CODES = {
    FailureCode.ENGINE_ERROR: ErrorCode.ENGINE_ERROR,
    FailureCode.ADMISSION_FAILED: ErrorCode.ENGINE_ADMISSION_FAILED,
    FailureCode.CONTEXT_LENGTH_EXCEEDED: ErrorCode.CONTEXT_LENGTH_EXCEEDED,
    FailureCode.INVALID_PROMPT: ErrorCode.INVALID_PROMPT,
    FailureCode.ENGINE_BUSY: ErrorCode.ENGINE_OVERLOADED,
    FailureCode.ENGINE_UNAVAILABLE: ErrorCode.ENGINE_UNAVAILABLE,
    FailureCode.SHUTTING_DOWN: ErrorCode.SERVER_SHUTTING_DOWN,
    FailureCode.TASK_UNAVAILABLE: ErrorCode.ENGINE_TASK_UNAVAILABLE,
}


# causes that say nothing about the conversation's content: its items stay
_TRANSIENT = frozenset({FailureCode.ENGINE_BUSY, FailureCode.ENGINE_UNAVAILABLE, FailureCode.SHUTTING_DOWN})


def failure_error(response_id: str, failed: TurnFailed) -> tuple[ErrorDetail, bool]:
    """(`status_details.error`, transient) of a response whose engine turn failed, by its machine-readable
    cause; a prompt over the context (the thinker names its `max_seq_len`) is `context_length_exceeded`."""
    code = _FAILURE_CODES.get(failed.code, ErrorCode.ENGINE_ERROR)
    if failed.code is FailureCode.INVALID_PROMPT and "max_seq_len" in failed.message:
        code = ErrorCode.CONTEXT_LENGTH_EXCEEDED
    error = ErrorDetail(type=code.error_type.value, code=code.value,
                        message=code.render(response_id=response_id, detail=failed.message))
    return error, failed.code in _TRANSIENT


@dataclass(frozen=True, slots=True)
class ResponseSpec:
    """The effective parameters of one response (session values with `response.create` overrides)."""

    response_id: str
    voice: str
    output_modalities: tuple[Modality, ...]
    output_format: AudioFormat
    max_output_tokens: MaxOutputTokens
    temperature: float
    conversation_id: str | None  # None: out of band, not added to the conversation
    metadata: Mapping[str, str] | None = None
    forces_call: bool = False  # tool_choice required / named: the reply starts with a call, not a message

    @property
    def is_audio(self) -> bool:
        """Spoken (audio + transcript) rather than text."""
        return Modality.AUDIO in self.output_modalities


class ActiveResponse:
    """Event builder and bookkeeping of the response currently generating.

    Its assistant message is output item 0, announced with `response.created` and added to `conversation`,
    except when the response forces a call (`spec.forces_call`): then the message is opened only when text
    or audio arrives (after the calls, at the next output index), so a reply that is only a call adds no
    empty message. Times are `time.monotonic()` seconds (the engine's `StageMark.t` uses the same clock).
    """

    def __init__(
        self,
        spec: ResponseSpec,
        item: AssistantItem,
        *,
        engine_rate_hz: int,
        frame_ms: int,
        input_end_at: float,
        is_speculative: bool,
        conversation: Conversation | None = None,
        mcp_target: Callable[[str], McpTarget | None] = lambda _name: None,
        playback: PlaybackClock | None = None,
    ) -> None:
        """`playback`: the clock that follows the client's playback of this response's audio (each delta is
        counted as it is built, i.e. as it goes out)."""
        self.spec = spec
        self.params: object | None = None  # the response.create parameters (a follow-up response reuses them)
        self.deferred: tuple[ResponseStatus, dict] | None = None  # ended in the engine, waits for its MCP calls
        self.follow_ups = 0  # responses created before this one to answer from MCP results
        self.owes_answer = False  # an approved MCP call settled while it ran: a follow-up answers once it completes
        self.item = item
        self._conversation = conversation
        self._is_message_open = False
        self.calls = ResponseCalls(spec.response_id, conversation, self._next_output_index, mcp_target)
        self.input_end_at = input_end_at
        self.is_speculative = is_speculative
        self.first_audio_at: float | None = None
        self.playback = playback
        self.stages: dict[Stage, float] = {}
        self._encoder = OutputEncoder(spec.output_format, engine_rate_hz, frame_ms) if spec.is_audio else None
        if self._encoder is not None:
            item.codec = self._encoder.codec
            item.audio = self._encoder.audio  # shared: the item always holds exactly what was sent
        self._ids = {"response_id": spec.response_id, "item_id": item.id, "output_index": 0, "content_index": 0}

    @property
    def id(self) -> str:
        """Response id (also the engine turn id)."""
        return self.spec.response_id

    def _next_output_index(self) -> int:
        return int(self._is_message_open) + len(self.calls.items)

    def _response(self, status: ResponseStatus, details: StatusDetails | None, usage: Usage | None) -> Response:
        output: list = []
        if status is not ResponseStatus.IN_PROGRESS:
            output = list(self.calls.views())
            if self._is_message_open:
                output.insert(self._ids["output_index"], self.item.view())
        return Response(
            id=self.id,
            voice=self.spec.voice,
            status=status,
            status_details=details,
            output=tuple(output),
            usage=usage,
            conversation_id=self.spec.conversation_id,
            output_modalities=self.spec.output_modalities,
            output_format=self.spec.output_format,
            max_output_tokens=self.spec.max_output_tokens,
            metadata=self.spec.metadata,
            temperature=self.spec.temperature,
        )

    def _part(self) -> OutputAudio | OutputText:
        if self.spec.is_audio:
            return OutputAudio(transcript=self.item.text)
        return OutputText(self.item.text)

    def created_events(self) -> list[ServerEvent]:
        """`response.created`, then (unless the response forces a call) the message item and its content part,
        all empty."""
        events: list[ServerEvent] = [ResponseCreated(response=self._response(ResponseStatus.IN_PROGRESS, None, None))]
        return events if self.spec.forces_call else events + self._open_message()

    def _open_message(self) -> list[ServerEvent]:
        """Announce the message item at the next output index (and add it to the conversation)."""
        self._ids["output_index"] = self._next_output_index()
        self._is_message_open = True
        events: list[ServerEvent] = [ResponseOutputItemAdded(
            response_id=self.id, output_index=self._ids["output_index"], item=self.item.view(empty=True))]
        if self._conversation is not None:
            previous = self._conversation.last_id()
            self._conversation.insert(self.item)
            events.append(ConversationItemAdded(item=self.item.view(empty=True), previous_item_id=previous))
        empty_part = OutputAudio(transcript="") if self.spec.is_audio else OutputText("")
        events.append(ResponseContentPartAdded(**self._ids, part=empty_part))
        return events

    def on_text(self, text: str) -> list[ServerEvent]:
        """A thinker text delta: transcript delta (audio) or text delta (text-only)."""
        if not text:
            return []
        events = [] if self._is_message_open else self._open_message()
        self.item.text += text
        if self.spec.is_audio:
            return events + [ResponseOutputAudioTranscriptDelta(**self._ids, delta=text)]
        return events + [ResponseOutputTextDelta(**self._ids, delta=text)]

    @property
    def frame_samples(self) -> int:
        """Samples of one full audio delta at the wire rate (0: a text response)."""
        return 0 if self._encoder is None else self._encoder.frame_samples

    @property
    def wire_rate_hz(self) -> int:
        """The sample rate of the audio deltas."""
        return self._encoder.codec.sample_rate_hz if self._encoder is not None else 0

    def resample(self, pcm: np.ndarray) -> np.ndarray:
        """Engine PCM (float32 at the engine rate) → wire-rate samples for `on_wire_audio` (in order; empty for a
        text response)."""
        return self._encoder.resample(pcm) if self._encoder is not None else np.zeros(0, np.float32)

    def resample_tail(self) -> np.ndarray:
        """The end of the response's audio: the resampler's tail, for `on_wire_audio` (`finish` then adds none)."""
        return self._encoder.tail() if self._encoder is not None else np.zeros(0, np.float32)

    def on_audio(self, pcm: np.ndarray, now: float, whole: bool = False) -> list[ServerEvent]:
        """Engine PCM (float32 at the engine rate) → audio deltas (`on_wire_audio`)."""
        return self.on_wire_audio(self.resample(pcm), now, whole)

    def on_wire_audio(self, samples: np.ndarray, now: float, whole: bool = False) -> list[ServerEvent]:
        """Wire-rate samples (`resample`) → audio deltas of at most `frame_ms`; one delta when `whole` (a
        confirmed speculative turn's held audio, released at once: `AudioChunk.backlog`) or when the audio sent is
        more than `AHEAD_WHOLE_CHUNKS_S` ahead of real time."""
        if self._encoder is None or not samples.size:
            return []
        ahead = (self.first_audio_at is not None
                 and self._encoder.duration_ms / 1000.0 - (now - self.first_audio_at) > AHEAD_WHOLE_CHUNKS_S)
        before_ms = self._encoder.duration_ms
        return self._deltas(self._encoder.encode(samples, whole=whole or ahead), now, before_ms)

    def _deltas(self, frames: list[str], now: float, before_ms: float) -> list[ServerEvent]:
        if self.playback is not None and self._encoder is not None:
            self.playback.sent(self._encoder.duration_ms - before_ms, now)
        if not frames:
            return []
        if self.first_audio_at is None:
            self.first_audio_at = now
        events = [] if self._is_message_open else self._open_message()
        return events + [ResponseOutputAudioDelta(**self._ids, delta=frame) for frame in frames]

    def on_stage(self, stage: Stage, t: float) -> None:
        """Record an engine stage timestamp."""
        self.stages.setdefault(stage, t)

    def finish(
        self,
        status: ResponseStatus,
        now: float,
        *,
        reason: StatusReason | None = None,
        error: ErrorDetail | None = None,
        usage: Usage | None = None,
        timing_events: bool = False,
    ) -> tuple[list[ServerEvent], ResponseFinished]:
        """All closing events (each `.done` once, then `response.done`) and the metrics record.

        A completed response first flushes the resampler's tail; a cancelled one drops it.
        """
        events: list[ServerEvent] = []
        if status is ResponseStatus.COMPLETED and self._encoder is not None:
            before_ms = self._encoder.duration_ms
            events += self._deltas(self._encoder.flush(), now, before_ms)
        if self.playback is not None:
            self.playback.done = True
        self.item.status = _ITEM_STATUS.get(status, ItemStatus.INCOMPLETE)
        if self._is_message_open:
            events += self._message_done()
        events += self.calls.finish()
        details = None if status is ResponseStatus.COMPLETED else StatusDetails(type=status, reason=reason, error=error)
        events.append(ResponseDone(response=self._response(status, details, usage)))
        if timing_events:
            events.append(RealtimeMingResponseTimings(response_id=self.id, timings=self._timings_ms(now)))
        return events, self._record(status)

    def _message_done(self) -> list[ServerEvent]:
        events: list[ServerEvent] = []
        if self.spec.is_audio:
            events.append(ResponseOutputAudioDone(**self._ids))
            events.append(ResponseOutputAudioTranscriptDone(**self._ids, transcript=self.item.text))
        else:
            events.append(ResponseOutputTextDone(**self._ids, text=self.item.text))
        events.append(ResponseContentPartDone(**self._ids, part=self._part()))
        events.append(ResponseOutputItemDone(response_id=self.id, output_index=self._ids["output_index"],
                                             item=self.item.view()))
        if self._conversation is not None:
            events.append(ConversationItemDone(item=self.item.view()))
        return events

    def _timings_ms(self, now: float) -> dict[str, float]:
        """Milliseconds relative to the end of user input (negative: before it, e.g. speculation)."""
        origin = self.input_end_at
        timings = {stage.value: round((t - origin) * 1000.0, 3) for stage, t in self.stages.items()}
        if self.first_audio_at is not None:
            timings["first_audio_delta"] = round((self.first_audio_at - origin) * 1000.0, 3)
        timings["response_done"] = round((now - origin) * 1000.0, 3)
        return timings

    def _record(self, status: ResponseStatus) -> ResponseFinished:
        submitted = self.stages.get(Stage.SUBMITTED)
        stage_s = {}
        if submitted is not None:
            stage_s = {s.value: t - submitted for s, t in self.stages.items() if s is not Stage.SUBMITTED}
        ttfa = None if self.first_audio_at is None else self.first_audio_at - self.input_end_at
        return ResponseFinished(self.id, status, ttfa, self.is_speculative, stage_s)

