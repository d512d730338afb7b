"""Server events (`docs/protocol.md` §5): one registered class per GA wire type.

Only the 31 types pipecat accepts, plus our opt-in `realtime_ming.response.timings` and the WebRTC
`output_audio_buffer.*` events (`dialect.PLAYOUT_SERVER_TYPES`). Beta names
and the dropped beta `conversation.item.done` come from `dialect`'s alias table at serialise time.
Indices shared by the content events live in two private bases.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from realtime_ming.protocol.dialect import TIMINGS_EVENT_TYPE, Dialect
from realtime_ming.protocol.errors import ProtocolError
from realtime_ming.protocol.events import ServerEvent, register
from realtime_ming.protocol.items import ConversationItem, OutputAudio, OutputText
from realtime_ming.protocol.mcp_events import MCP_SERVER_TYPES  # noqa: F401  (registers the MCP events)
from realtime_ming.protocol.responses import (
    Conversation,
    ErrorDetail,
    RateLimit,
    Response,
    TranscriptionUsage,
)
from realtime_ming.protocol.session import SessionConfig
from realtime_ming.protocol.wire import JsonValue

__all__ = [
    "ConversationCreated",
    "ConversationItemAdded",
    "ConversationItemDeleted",
    "ConversationItemDone",
    "ConversationItemInputAudioTranscriptionCompleted",
    "ConversationItemInputAudioTranscriptionDelta",
    "ConversationItemInputAudioTranscriptionFailed",
    "ConversationItemRetrieved",
    "ConversationItemTruncated",
    "Error",
    "InputAudioBufferCleared",
    "InputAudioBufferCommitted",
    "InputAudioBufferSpeechStarted",
    "InputAudioBufferSpeechStopped",
    "InputAudioBufferTimeoutTriggered",
    "OutputAudioBufferCleared",
    "OutputAudioBufferStarted",
    "OutputAudioBufferStopped",
    "RateLimitsUpdated",
    "RealtimeMingResponseTimings",
    "ResponseContentPartAdded",
    "ResponseContentPartDone",
    "ResponseCreated",
    "ResponseDone",
    "ResponseFunctionCallArgumentsDelta",
    "ResponseFunctionCallArgumentsDone",
    "ResponseOutputAudioDelta",
    "ResponseOutputAudioDone",
    "ResponseOutputAudioTranscriptDelta",
    "ResponseOutputAudioTranscriptDone",
    "ResponseOutputItemAdded",
    "ResponseOutputItemDone",
    "ResponseOutputTextDelta",
    "ResponseOutputTextDone",
    "SessionCreated",
    "SessionUpdated",
]


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class Error(ServerEvent):
    """A non-fatal (unless the connection is then closed) error; see `ErrorCode`."""

    type: ClassVar[str] = "error"
    error: ErrorDetail

    @classmethod
    def from_protocol_error(cls, error: ProtocolError) -> Error:
        """The `error` event for `error`, echoing its client `event_id`."""
        return cls(error=ErrorDetail.from_protocol_error(error))


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionCreated(ServerEvent):
    """First server event: the default session."""

    type: ClassVar[str] = "session.created"
    session: SessionConfig


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionUpdated(ServerEvent):
    """Answer to each `session.update`: the full effective session."""

    type: ClassVar[str] = "session.updated"
    session: SessionConfig


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationCreated(ServerEvent):
    """The default conversation exists."""

    type: ClassVar[str] = "conversation.created"
    conversation: Conversation


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioBufferSpeechStarted(ServerEvent):
    """VAD start; `audio_start_ms` includes prefix padding, `item_id` is the future user item."""

    type: ClassVar[str] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioBufferSpeechStopped(ServerEvent):
    """VAD end of speech."""

    type: ClassVar[str] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioBufferTimeoutTriggered(ServerEvent):
    """GA idle_timeout_ms passed after the last reply without speech: the idle audio becomes `item_id`."""

    type: ClassVar[str] = "input_audio_buffer.timeout_triggered"
    audio_start_ms: int
    audio_end_ms: int
    item_id: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioBufferCommitted(ServerEvent):
    """The buffer became user item `item_id`, placed after `previous_item_id`."""

    type: ClassVar[str] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None = None


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioBufferCleared(ServerEvent):
    """Answer to `input_audio_buffer.clear`."""

    type: ClassVar[str] = "input_audio_buffer.cleared"


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemAdded(ServerEvent):
    """An item entered the conversation (assistant items arrive empty, `in_progress`).

    Beta: sent as `conversation.item.created`.
    """

    type: ClassVar[str] = "conversation.item.added"
    item: ConversationItem
    previous_item_id: str | None = None


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemDone(ServerEvent):
    """An item is final. Beta has no counterpart: dropped on beta connections."""

    type: ClassVar[str] = "conversation.item.done"
    item: ConversationItem
    previous_item_id: str | None = None


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemRetrieved(ServerEvent):
    """Answer to `conversation.item.retrieve` (with audio)."""

    type: ClassVar[str] = "conversation.item.retrieved"
    item: ConversationItem


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemTruncated(ServerEvent):
    """Answer to `conversation.item.truncate`."""

    type: ClassVar[str] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemDeleted(ServerEvent):
    """Answer to `conversation.item.delete`."""

    type: ClassVar[str] = "conversation.item.deleted"
    item_id: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemInputAudioTranscriptionDelta(ServerEvent):
    """Partial transcript of a user audio item."""

    type: ClassVar[str] = "conversation.item.input_audio_transcription.delta"
    item_id: str
    content_index: int
    delta: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemInputAudioTranscriptionCompleted(ServerEvent):
    """Final transcript of a user audio item."""

    type: ClassVar[str] = "conversation.item.input_audio_transcription.completed"
    item_id: str
    content_index: int
    transcript: str
    usage: TranscriptionUsage


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemInputAudioTranscriptionFailed(ServerEvent):
    """Transcription of a user audio item failed."""

    type: ClassVar[str] = "conversation.item.input_audio_transcription.failed"
    item_id: str
    content_index: int
    error: ErrorDetail


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCreated(ServerEvent):
    """A response started (`status: in_progress`, empty output)."""

    type: ClassVar[str] = "response.created"
    response: Response


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseDone(ServerEvent):
    """A response ended; sent after every other `.done` of that response."""

    type: ClassVar[str] = "response.done"
    response: Response


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimitsUpdated(ServerEvent):
    """Rate limits (`rate_limits.updated`): defined for decoding, never sent by this server, which has no
    request or token quotas to report (docs/protocol.md §5.1); OpenAI's numbers would be invented here."""

    type: ClassVar[str] = "rate_limits.updated"
    rate_limits: tuple[RateLimit, ...]


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class OutputAudioBufferStarted(ServerEvent):
    """WebRTC: the server's playout began playing the audio of `response_id` (codec `playout`)."""

    type: ClassVar[str] = "output_audio_buffer.started"
    response_id: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class OutputAudioBufferStopped(ServerEvent):
    """WebRTC: the audio of `response_id` has all been played, after its `response.done`."""

    type: ClassVar[str] = "output_audio_buffer.stopped"
    response_id: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class OutputAudioBufferCleared(ServerEvent):
    """WebRTC: the unplayed audio of `response_id` was dropped (a barge-in, `output_audio_buffer.clear`)."""

    type: ClassVar[str] = "output_audio_buffer.cleared"
    response_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class _OutputItemEvent(ServerEvent):
    response_id: str
    output_index: int
    item: ConversationItem


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseOutputItemAdded(_OutputItemEvent):
    """An output item (message or function call) started."""

    type: ClassVar[str] = "response.output_item.added"


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseOutputItemDone(_OutputItemEvent):
    """An output item is final."""

    type: ClassVar[str] = "response.output_item.done"


@dataclass(frozen=True, slots=True, kw_only=True)
class _ContentEvent(ServerEvent):
    response_id: str
    item_id: str
    output_index: int
    content_index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class _ContentPartEvent(_ContentEvent):
    part: OutputText | OutputAudio

    def wire_body(self, dialect: Dialect) -> dict[str, JsonValue]:
        """Fields with `part.type` `text` / `audio`: the SDK's content-part events use the
        beta content names in both dialects."""
        body = ServerEvent.wire_body(self, dialect)
        body["part"] = self.part.to_wire(Dialect.BETA)
        return body


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseContentPartAdded(_ContentPartEvent):
    """A content part (text, or audio with transcript) started."""

    type: ClassVar[str] = "response.content_part.added"


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseContentPartDone(_ContentPartEvent):
    """A content part is final."""

    type: ClassVar[str] = "response.content_part.done"


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseOutputTextDelta(_ContentEvent):
    """Text output chunk. Beta: `response.text.delta`."""

    type: ClassVar[str] = "response.output_text.delta"
    delta: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseOutputTextDone(_ContentEvent):
    """Full text output. Beta: `response.text.done`."""

    type: ClassVar[str] = "response.output_text.done"
    text: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseOutputAudioDelta(_ContentEvent):
    """Base64 audio chunk in the output format. Beta: `response.audio.delta`."""

    type: ClassVar[str] = "response.output_audio.delta"
    delta: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseOutputAudioDone(_ContentEvent):
    """Audio output finished. Beta: `response.audio.done`."""

    type: ClassVar[str] = "response.output_audio.done"


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseOutputAudioTranscriptDelta(_ContentEvent):
    """Transcript chunk of the audio output. Beta: `response.audio_transcript.delta`."""

    type: ClassVar[str] = "response.output_audio_transcript.delta"
    delta: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseOutputAudioTranscriptDone(_ContentEvent):
    """Full transcript of the audio output. Beta: `response.audio_transcript.done`."""

    type: ClassVar[str] = "response.output_audio_transcript.done"
    transcript: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseFunctionCallArgumentsDelta(ServerEvent):
    """Chunk of a function call's JSON arguments."""

    type: ClassVar[str] = "response.function_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseFunctionCallArgumentsDone(ServerEvent):
    """A function call is complete."""

    type: ClassVar[str] = "response.function_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class RealtimeMingResponseTimings(ServerEvent):
    """Our extension: per-turn stage timestamps in ms (e.g. `speech_stopped`, `first_audio`).

    Sent only to sessions that set `realtime_ming.timing_events`; `serialise` refuses otherwise.
    """

    type: ClassVar[str] = TIMINGS_EVENT_TYPE
    response_id: str
    timings: Mapping[str, float]
