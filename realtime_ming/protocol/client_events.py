"""Client events (`docs/protocol.md` §4): one registered class per wire type.

Names are identical in GA and beta; only nested shapes differ (`session`, `response`), and the
codecs of those fields handle the dialect. Audio stays base64 text here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Final

from realtime_ming.protocol.dialect import Dialect
from realtime_ming.protocol.events import ClientEvent, register
from realtime_ming.protocol.items import ITEM, ITEMS_OR_REFERENCES, ConversationItem, ItemReference
from realtime_ming.protocol.session import SESSION_PATCH, SPEED, TEMPERATURE, SessionPatch
from realtime_ming.protocol.speech_style import SPEECH_STYLE, SpeechStyle
from realtime_ming.protocol.unsupported import refuse_unsupported
from realtime_ming.protocol.values import (
    AUDIO_FORMAT,
    MAX_OUTPUT_TOKENS,
    METADATA,
    MODALITIES,
    TOOL_CHOICE,
    TOOLS,
    VOICE,
    AudioFormat,
    Tool,
    MaxOutputTokens,
    Modality,
    ToolChoice,
)
from realtime_ming.protocol.wire import (
    ID,
    NON_NEGATIVE_INT,
    STRING,
    TEXT,
    Codec,
    JsonValue,
    WireField,
    decode_fields,
    encode_attributes,
    enum_codec,
    expect_object,
    nullable,
)

__all__ = [
    "ConversationItemCreate",
    "ConversationItemDelete",
    "ConversationItemRetrieve",
    "ConversationItemTruncate",
    "ConversationMode",
    "InputAudioBufferAppend",
    "InputAudioBufferClear",
    "InputAudioBufferCommit",
    "OutputAudioBufferClear",
    "ResponseCancel",
    "ResponseCreate",
    "ResponseParams",
    "response_param",
    "SessionUpdate",
    "TranscriptionSessionUpdate",
]


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionUpdate(ClientEvent):
    """Partial session change; apply `session` with `apply_patch`. Answer: `session.updated`."""

    type: ClassVar[str] = "session.update"
    wire_fields: ClassVar[tuple[WireField, ...]] = (WireField.at("session", SESSION_PATCH, required=True),)
    session: SessionPatch


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioBufferAppend(ClientEvent):
    """Append base64 audio in the session input format (decoded by the audio layer)."""

    type: ClassVar[str] = "input_audio_buffer.append"
    wire_fields: ClassVar[tuple[WireField, ...]] = (WireField.at("audio", STRING, required=True),)
    audio: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioBufferCommit(ClientEvent):
    """Turn the buffered audio into a user item (no response by itself)."""

    type: ClassVar[str] = "input_audio_buffer.commit"


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioBufferClear(ClientEvent):
    """Drop the buffered audio and reset the turn detector."""

    type: ClassVar[str] = "input_audio_buffer.clear"


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemCreate(ClientEvent):
    """Insert `item` after `previous_item_id` (`"root"` = at the start, `None` = at the end)."""

    type: ClassVar[str] = "conversation.item.create"
    wire_fields: ClassVar[tuple[WireField, ...]] = (
        WireField.at("item", ITEM, required=True),
        WireField.at("previous_item_id", nullable(ID)),
    )
    item: ConversationItem
    previous_item_id: str | None = None


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemRetrieve(ClientEvent):
    """Ask for the server's copy of an item (with audio)."""

    type: ClassVar[str] = "conversation.item.retrieve"
    wire_fields: ClassVar[tuple[WireField, ...]] = (WireField.at("item_id", ID, required=True),)
    item_id: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemTruncate(ClientEvent):
    """Cut an assistant audio item after the `audio_end_ms` the client actually played."""

    type: ClassVar[str] = "conversation.item.truncate"
    wire_fields: ClassVar[tuple[WireField, ...]] = (
        WireField.at("item_id", ID, required=True),
        WireField.at("content_index", NON_NEGATIVE_INT, required=True),
        WireField.at("audio_end_ms", NON_NEGATIVE_INT, required=True),
    )
    item_id: str
    content_index: int
    audio_end_ms: int


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationItemDelete(ClientEvent):
    """Remove an item from the conversation."""

    type: ClassVar[str] = "conversation.item.delete"
    wire_fields: ClassVar[tuple[WireField, ...]] = (WireField.at("item_id", ID, required=True),)
    item_id: str


class ConversationMode(StrEnum):
    """Where a response writes: the default conversation or out of band."""

    AUTO = "auto"
    NONE = "none"


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseParams:
    """Per-response overrides from `response.create`; `None` means "use the session's value".

    `input`, when set, replaces the conversation as the model's context (items and references).
    `speed` and `speech` (extension `realtime_ming.speed` / `realtime_ming.speech`) override the
    session's speaking rate and speech style for this response.
    """

    conversation: ConversationMode = ConversationMode.AUTO
    instructions: str | None = None
    output_modalities: tuple[Modality, ...] | None = None
    voice: str | None = None
    output_format: AudioFormat | None = None
    tools: tuple[Tool, ...] | None = None
    tool_choice: ToolChoice | None = None
    max_output_tokens: MaxOutputTokens | None = None
    temperature: float | None = None
    metadata: Mapping[str, str] | None = None
    input: tuple[ConversationItem | ItemReference, ...] | None = None
    speed: float | None = None
    speech: SpeechStyle | None = None

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """The `response` object as a client sends it."""
        return encode_attributes(self, _RESPONSE_FIELDS[dialect], dialect, skip_none=True)


def _shared_response_fields() -> tuple[WireField, ...]:
    return (
        WireField.at("conversation", nullable(enum_codec(ConversationMode))),
        WireField.at("instructions", nullable(TEXT)),
        WireField.at("tools", nullable(TOOLS)),
        WireField.at("tool_choice", nullable(TOOL_CHOICE)),
        WireField.at("metadata", nullable(METADATA)),
        WireField.at("input", nullable(ITEMS_OR_REFERENCES)),
        WireField.at("speed", nullable(SPEED), "realtime_ming.speed"),
        WireField.at("speech", nullable(SPEECH_STYLE), "realtime_ming.speech"),
    )


_RESPONSE_FIELDS: Final[dict[Dialect, tuple[WireField, ...]]] = {
    Dialect.GA: (
        *_shared_response_fields(),
        WireField.at("output_modalities", nullable(MODALITIES)),
        WireField.at("output_format", nullable(AUDIO_FORMAT), "audio.output.format"),
        WireField.at("voice", nullable(VOICE), "audio.output.voice"),
        WireField.at("max_output_tokens", nullable(MAX_OUTPUT_TOKENS)),
        # Not in the GA schema, but sent by clients ported from beta: applied, like beta's.
        WireField.at("temperature", nullable(TEMPERATURE)),
    ),
    Dialect.BETA: (
        *_shared_response_fields(),
        WireField.at("output_modalities", nullable(MODALITIES), "modalities"),
        WireField.at("output_format", nullable(AUDIO_FORMAT), "output_audio_format"),
        WireField.at("voice", nullable(VOICE)),
        WireField.at("max_output_tokens", nullable(MAX_OUTPUT_TOKENS), "max_response_output_tokens"),
        WireField.at("temperature", nullable(TEMPERATURE)),
    ),
}


def response_param(name: str, dialect: Dialect) -> str:
    """Wire param path of `ResponseParams` attribute `name` in `dialect`, e.g. `response.max_output_tokens`."""
    path = next(f.path for f in _RESPONSE_FIELDS[dialect] if f.name == name)
    return ".".join(("response", *path))


def _decode_response_params(value: Any, param: str, dialect: Dialect) -> ResponseParams:
    if value is None:
        return ResponseParams()
    obj = expect_object(value, param)
    if dialect is Dialect.GA:
        refuse_unsupported(obj, param, dialect, with_prompt=True)
    values = decode_fields(obj, _RESPONSE_FIELDS[dialect], dialect, param)
    return ResponseParams(**{k: v for k, v in values.items() if v is not None})


_RESPONSE_PARAMS: Final[Codec[ResponseParams]] = Codec(_decode_response_params, lambda v, d: v.to_wire(d))


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCreate(ClientEvent):
    """Start a response. Answer: `response.created` … `response.done`."""

    type: ClassVar[str] = "response.create"
    wire_fields: ClassVar[tuple[WireField, ...]] = (WireField.at("response", _RESPONSE_PARAMS),)
    response: ResponseParams = ResponseParams()


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCancel(ClientEvent):
    """Cancel the active response (or the one named)."""

    type: ClassVar[str] = "response.cancel"
    wire_fields: ClassVar[tuple[WireField, ...]] = (WireField.at("response_id", nullable(ID)),)
    response_id: str | None = None


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class OutputAudioBufferClear(ClientEvent):
    """Cut off the reply's audio: the response stops, its item is truncated at the played position (the
    session's playback clock) and the server answers `output_audio_buffer.cleared`."""

    type: ClassVar[str] = "output_audio_buffer.clear"


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptionSessionUpdate(ClientEvent):
    """Beta transcription-session config; its body is ignored and the session answers with
    `ErrorCode.UNSUPPORTED_EVENT` (this server runs conversation sessions only)."""

    type: ClassVar[str] = "transcription_session.update"

    def to_wire(self, dialect: Dialect) -> dict[str, JsonValue]:
        """The event with an empty `session` (the beta schema requires the key)."""
        return {**ClientEvent.to_wire(self, dialect), "session": {}}
