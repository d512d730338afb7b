"""Server-side value objects: the response object, usage, status details, errors, rate limits.

`Response` renders the GA shape (`output_modalities`, `audio.output`) or the beta shape
(`modalities`, `voice`, `output_audio_format`), always with `id`, `object`, `status`,
`status_details` and `output` present (pipecat's older models require them, docs/protocol.md §9).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Final

from realtime_ming.protocol.dialect import Dialect
from realtime_ming.protocol.errors import ProtocolError
from realtime_ming.protocol.items import ConversationItem
from realtime_ming.protocol.values import AUDIO_FORMAT, MODALITIES, VOICE, AudioFormat, MaxOutputTokens, Modality
from realtime_ming.protocol.wire import (
    NON_NEGATIVE_INT,
    JsonValue,
    WireField,
    decode_fields,
    encode_attributes,
    expect_number,
    expect_object,
    join,
    read_dataclass,
    to_json,
)

__all__ = [
    "Conversation",
    "ErrorDetail",
    "RateLimit",
    "RateLimitName",
    "Response",
    "ResponseStatus",
    "StatusDetails",
    "StatusReason",
    "TranscriptionDurationUsage",
    "TranscriptionTokenUsage",
    "TranscriptionUsage",
    "Usage",
]


class ResponseStatus(StrEnum):
    """Response lifecycle state."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    INCOMPLETE = "incomplete"


class StatusReason(StrEnum):
    """Why a response ended cancelled or incomplete."""

    TURN_DETECTED = "turn_detected"
    CLIENT_CANCELLED = "client_cancelled"
    MAX_OUTPUT_TOKENS = "max_output_tokens"
    CONTENT_FILTER = "content_filter"


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorDetail:
    """The `error` object of an `error` event, a failed transcription or a failed response."""

    type: str
    message: str
    code: str | None = None
    param: str | None = None
    event_id: str | None = None

    @classmethod
    def from_protocol_error(cls, error: ProtocolError) -> ErrorDetail:
        """Detail for a `ProtocolError`, echoing its client `event_id`."""
        return cls(
            type=error.code.error_type.value,
            message=error.message,
            code=error.code.value,
            param=error.param,
            event_id=error.event_id,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusDetails:
    """`status_details` of a finished response."""

    type: ResponseStatus
    reason: StatusReason | None = None
    error: ErrorDetail | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token counts of one response, by modality (docs/realtime_api.md "Usage"): input audio / image tokens are the
    prompt's media placeholder tokens, the cached ones the part of the prompt reused from the KV cache;
    output audio tokens are talker steps (one step = one latent patch of speech)."""

    input_text_tokens: int = 0
    input_audio_tokens: int = 0
    input_image_tokens: int = 0
    input_cached_tokens: int = 0
    output_text_tokens: int = 0
    output_audio_tokens: int = 0
    input_cached_text_tokens: int = 0
    input_cached_audio_tokens: int = 0
    input_cached_image_tokens: int = 0

    @property
    def input_tokens(self) -> int:
        """All prompt tokens."""
        return self.input_text_tokens + self.input_audio_tokens + self.input_image_tokens

    @property
    def output_tokens(self) -> int:
        """All generated tokens."""
        return self.output_text_tokens + self.output_audio_tokens

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """The `usage` object: totals, then every count at its `_USAGE_FIELDS` path."""
        totals = {"total_tokens": self.input_tokens + self.output_tokens,
                  "input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        return {**totals, **encode_attributes(self, _USAGE_FIELDS, dialect, skip_none=False)}

    @classmethod
    def from_wire(cls, value: Any, param: str, dialect: Dialect) -> Usage:
        """The inverse of `to_wire` (the totals are derived, so not read)."""
        return cls(**decode_fields(expect_object(value, param), _USAGE_FIELDS, dialect, param))


_USAGE_FIELDS: Final = tuple(
    WireField.at(name, NON_NEGATIVE_INT, path)
    for name, path in (
        ("input_text_tokens", "input_token_details.text_tokens"),
        ("input_audio_tokens", "input_token_details.audio_tokens"),
        ("input_image_tokens", "input_token_details.image_tokens"),
        ("input_cached_tokens", "input_token_details.cached_tokens"),
        ("input_cached_text_tokens", "input_token_details.cached_tokens_details.text_tokens"),
        ("input_cached_audio_tokens", "input_token_details.cached_tokens_details.audio_tokens"),
        ("input_cached_image_tokens", "input_token_details.cached_tokens_details.image_tokens"),
        ("output_text_tokens", "output_token_details.text_tokens"),
        ("output_audio_tokens", "output_token_details.audio_tokens"),
    )
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    """The `response` object of `response.created` / `response.done`.

    `conversation_id` is `None` for out-of-band responses (`conversation: "none"`).
    """

    object: ClassVar[str] = "realtime.response"
    id: str
    voice: str
    status: ResponseStatus = ResponseStatus.IN_PROGRESS
    status_details: StatusDetails | None = None
    output: tuple[ConversationItem, ...] = ()
    usage: Usage | None = None
    conversation_id: str | None = None
    output_modalities: tuple[Modality, ...] = (Modality.AUDIO,)
    output_format: AudioFormat = AudioFormat()
    max_output_tokens: MaxOutputTokens = "inf"
    metadata: Mapping[str, str] | None = None
    temperature: float | None = None

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """GA or beta response object."""
        wire: dict[str, JsonValue] = {
            "id": self.id,
            "object": self.object,
            "status": self.status.value,
            "status_details": to_json(self.status_details, dialect),
            "output": [item.to_wire(dialect) for item in self.output],
            "usage": to_json(self.usage, dialect),
            "conversation_id": self.conversation_id,
            "max_output_tokens": self.max_output_tokens,
            "metadata": None if self.metadata is None else dict(self.metadata),
        }
        modalities = MODALITIES.encode(self.output_modalities, dialect)
        if dialect is Dialect.GA:
            wire["output_modalities"] = modalities
            wire["audio"] = {"output": {"format": self.output_format.to_wire(dialect), "voice": self.voice}}
        else:
            wire.update(
                modalities=modalities,
                voice=self.voice,
                output_audio_format=self.output_format.to_wire(dialect),
                temperature=self.temperature,
            )
        return wire

    @classmethod
    def from_wire(cls, value: Any, param: str, dialect: Dialect) -> Response:
        """The inverse of `to_wire` for `dialect` (GA carries no `temperature`: read back as `None`).
        Server values are read as written (a beta temperature of 0 = greedy is kept)."""
        obj = expect_object(value, param)
        known: dict[str, Any] = {}
        if dialect is Dialect.GA:
            output = expect_object(expect_object(obj.get("audio", {}), join(param, "audio")).get("output", {}),
                                   join(param, "audio.output"))
            shape = {"output_modalities": obj.get("output_modalities"), "voice": output.get("voice"),
                     "output_format": output.get("format")}
            paths = {"output_modalities": "output_modalities", "voice": "audio.output.voice",
                     "output_format": "audio.output.format"}
        else:
            shape = {"output_modalities": obj.get("modalities"), "voice": obj.get("voice"),
                     "output_format": obj.get("output_audio_format")}
            paths = {"output_modalities": "modalities", "voice": "voice", "output_format": "output_audio_format"}
            if obj.get("temperature") is not None:
                known["temperature"] = expect_number(obj["temperature"], join(param, "temperature"))
        codecs = {"output_modalities": MODALITIES, "voice": VOICE, "output_format": AUDIO_FORMAT}
        for name, raw in shape.items():
            if raw is not None:
                known[name] = codecs[name].decode(raw, join(param, paths[name]), dialect)
        rest = {key: item for key, item in obj.items() if key not in ("temperature", *paths)}
        return read_dataclass(cls, rest, param, dialect, **known)


@dataclass(frozen=True, slots=True)
class Conversation:
    """The default conversation announced by `conversation.created`."""

    id: str

    def to_wire(self, _dialect: Dialect) -> JsonValue:
        """`{"id", "object": "realtime.conversation"}`."""
        return {"id": self.id, "object": "realtime.conversation"}


class RateLimitName(StrEnum):
    """Rate limit families."""

    REQUESTS = "requests"
    TOKENS = "tokens"


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """One entry of `rate_limits.updated`."""

    name: RateLimitName
    limit: int
    remaining: int
    reset_seconds: float


@dataclass(frozen=True, slots=True)
class TranscriptionTokenUsage:
    """Token usage of an input transcription."""

    type: ClassVar[str] = "tokens"
    input_tokens: int
    output_tokens: int

    def to_wire(self, _dialect: Dialect) -> JsonValue:
        """`{"type": "tokens", ...}`."""
        return {
            "type": self.type,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.input_tokens + self.output_tokens,
        }


@dataclass(frozen=True, slots=True)
class TranscriptionDurationUsage:
    """Duration-billed usage of an input transcription."""

    type: ClassVar[str] = "duration"
    seconds: float

    def to_wire(self, _dialect: Dialect) -> JsonValue:
        """`{"type": "duration", "seconds": ...}`."""
        return {"type": self.type, "seconds": self.seconds}


TranscriptionUsage = TranscriptionTokenUsage | TranscriptionDurationUsage
