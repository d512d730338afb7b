"""A session's audio-input settings (`docs/protocol.md` §3): turn detection (`server_vad` / `semantic_vad`), input
transcription and noise reduction, each a frozen value with its wire codec. Nested objects are replaced as a whole,
missing sub-fields taking their defaults; `protocol/session.py` places them in the session's field table.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeAlias

from realtime_ming.protocol.dialect import Dialect
from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import MAX_QUOTE_CHARS, ProtocolError, clip
from realtime_ming.protocol.limits import MAX_DESCRIPTION_CHARS, MAX_METADATA_VALUE_CHARS
from realtime_ming.protocol.wire import (BOOL, ID, Codec, JsonValue, WireField, decode_fields, encode_attributes,
                                         enum_codec, expect_int, expect_list, expect_object, expect_str, expect_text,
                                         invalid_value, join, nullable, number_codec, text_codec)

__all__ = [
    "DEFAULT_NOISE_REDUCTION_STRENGTH",
    "MAX_TRANSCRIPTION_TERMS",
    "NOISE_REDUCTION",
    "TRANSCRIPTION",
    "TURN_DETECTION",
    "Eagerness",
    "InputTranscription",
    "NoiseReduction",
    "NoiseReductionType",
    "SemanticVad",
    "ServerVad",
    "TurnDetection",
]

class Eagerness(StrEnum):
    """`semantic_vad` eagerness; `auto` equals `medium` (max waits 8 s / 4 s / 2 s)."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    AUTO = "auto"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerVad:
    """Energy/VAD-based turns with OpenAI's defaults; `idle_timeout_ms` `None` = off (GA only)."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SemanticVad:
    """Model-based end-of-turn detection."""

    eagerness: Eagerness = Eagerness.AUTO
    create_response: bool = True
    interrupt_response: bool = True


TurnDetection: TypeAlias = ServerVad | SemanticVad | None

_NON_NEGATIVE_MS = Codec(lambda v, p, _d: expect_int(v, p, minimum=0), lambda v, _d: v)
_SERVER_VAD_FIELDS: Final = (
    WireField.at("threshold", number_codec(0.0, 1.0)),
    WireField.at("prefix_padding_ms", _NON_NEGATIVE_MS),
    WireField.at("silence_duration_ms", _NON_NEGATIVE_MS),
    WireField.at("create_response", BOOL),
    WireField.at("interrupt_response", BOOL),
    WireField.at("idle_timeout_ms", nullable(_NON_NEGATIVE_MS)),
)
_SEMANTIC_VAD_FIELDS: Final = (
    WireField.at("eagerness", enum_codec(Eagerness)),
    WireField.at("create_response", BOOL),
    WireField.at("interrupt_response", BOOL),
)
_TURN_DETECTION_KINDS: Final = {
    "server_vad": (ServerVad, _SERVER_VAD_FIELDS),
    "semantic_vad": (SemanticVad, _SEMANTIC_VAD_FIELDS),
}


def _decode_turn_detection(value: Any, param: str, dialect: Dialect) -> ServerVad | SemanticVad:
    obj = expect_object(value, param)
    kind = expect_str(obj.get("type", "server_vad"), join(param, "type"))
    if kind not in _TURN_DETECTION_KINDS:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_TURN_DETECTION,
            param=join(param, "type"),
            kind=clip(kind, MAX_QUOTE_CHARS),
            supported=", ".join(_TURN_DETECTION_KINDS),
        )
    cls, table = _TURN_DETECTION_KINDS[kind]
    return cls(**decode_fields(obj, table, dialect, param))


def _encode_turn_detection(value: ServerVad | SemanticVad, dialect: Dialect) -> JsonValue:
    kind = "server_vad" if isinstance(value, ServerVad) else "semantic_vad"
    table = _TURN_DETECTION_KINDS[kind][1]
    if dialect is Dialect.BETA:  # idle_timeout_ms is GA only
        table = tuple(f for f in table if f.name != "idle_timeout_ms")
    return {"type": kind, **encode_attributes(value, table, dialect, skip_none=False)}


@dataclass(frozen=True, slots=True, kw_only=True)
class InputTranscription:
    """Requested input transcription, run by the served model's ASR (`session/transcription.py` says how
    `language`, `languages`, `prompt` and `keywords` enter its prompt)."""

    model: str | None = None
    language: str | None = None
    languages: tuple[str, ...] | None = None
    prompt: str | None = None
    keywords: tuple[str, ...] | None = None


MAX_TRANSCRIPTION_TERMS: Final = 100  # keywords / languages of one transcription setting


def _decode_terms(value: Any, param: str, _dialect: Dialect) -> tuple[str, ...]:
    items = expect_list(value, param, MAX_TRANSCRIPTION_TERMS)
    return tuple(expect_text(v, join(param, i), MAX_METADATA_VALUE_CHARS, single_line=True) for i, v in enumerate(items))


_TERMS = Codec(_decode_terms, lambda v, _d: list(v))
_TRANSCRIPTION_FIELDS: Final = (
    WireField.at("model", nullable(ID)),
    WireField.at("language", nullable(ID)),
    WireField.at("languages", nullable(_TERMS)),
    WireField.at("prompt", nullable(text_codec(MAX_DESCRIPTION_CHARS))),
    WireField.at("keywords", nullable(_TERMS)),
)


class NoiseReductionType(StrEnum):
    """Microphone distance class for input noise reduction."""

    NEAR_FIELD = "near_field"
    FAR_FIELD = "far_field"


@dataclass(frozen=True, slots=True)
class NoiseReduction:
    """Input noise reduction for a microphone class (`audio/denoise.py` says what each does).

    `strength` (0-1, more is stronger) is `None` only in an update that leaves it out: the effective session
    keeps the previous strength, or 1.0 when noise reduction is first enabled (OpenAI's documented default).
    """

    type: NoiseReductionType
    strength: float | None = None


DEFAULT_NOISE_REDUCTION_STRENGTH: Final = 1.0
_NOISE_REDUCTION_FIELDS: Final = (
    WireField.at("type", enum_codec(NoiseReductionType), required=True),
    WireField.at("strength", nullable(number_codec(0.0, 1.0))),
)


def _record_codec(cls: type, table: tuple[WireField, ...]) -> Codec[Any]:
    """Codec for a flat dataclass described by `table`; unset (`None`) fields are left out."""

    def decode(value: Any, param: str, dialect: Dialect) -> Any:
        return cls(**decode_fields(expect_object(value, param), table, dialect, param))

    def encode(value: Any, dialect: Dialect) -> JsonValue:
        return encode_attributes(value, table, dialect, skip_none=True)

    return Codec(decode, encode)


_TRANSCRIPTION_RECORD: Final = _record_codec(InputTranscription, _TRANSCRIPTION_FIELDS)


def _decode_transcription(value: Any, param: str, dialect: Dialect) -> InputTranscription:
    if isinstance(value, dict) and value.get("delay") is not None:
        raise invalid_value(join(param, "delay"), "the transcription delay is not adjustable: each committed turn"
                            " is transcribed as a whole by the served model's ASR (leave 'delay' out or null)")
    return _TRANSCRIPTION_RECORD.decode(value, param, dialect)


TRANSCRIPTION: Final = Codec(_decode_transcription, _TRANSCRIPTION_RECORD.encode)
NOISE_REDUCTION: Final = _record_codec(NoiseReduction, _NOISE_REDUCTION_FIELDS)
TURN_DETECTION: Final[Codec[ServerVad | SemanticVad]] = Codec(_decode_turn_detection, _encode_turn_detection)
