"""Value types shared by the session config, `response.create` and the response object.

Output modalities, audio formats, voices, function tools, tool choice and token limits, each with
one dialect-aware `Codec` (GA objects vs beta strings, `docs/protocol.md` §3.2, §7).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Literal, TypeAlias

from realtime_ming.protocol.dialect import Dialect
from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import MAX_QUOTE_CHARS, ProtocolError, clip
from realtime_ming.protocol.mcp import McpTool, decode_mcp_tool
from realtime_ming.protocol.limits import (
    MAX_DESCRIPTION_CHARS,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
    MAX_NAME_CHARS,
    MAX_SCHEMA_JSON_BYTES,
    MAX_TOOLS,
    check_tools_size,
)
from realtime_ming.protocol.wire import (
    Codec,
    JsonValue,
    expect_bounded_json,
    expect_choice,
    expect_int,
    expect_list,
    expect_object,
    expect_str,
    expect_text,
    invalid_value,
    join,
    quote,
)

__all__ = [
    "AUDIO_FORMAT",
    "G711_SAMPLE_RATE_HZ",
    "GA_PCM_SAMPLE_RATE_HZ",
    "MAX_OUTPUT_TOKENS",
    "METADATA",
    "MODALITIES",
    "PCM_SAMPLE_RATES_HZ",
    "TOOLS",
    "TOOL_CHOICE",
    "VOICE",
    "AudioEncoding",
    "AudioFormat",
    "FunctionChoice",
    "FunctionTool",
    "MaxOutputTokens",
    "Modality",
    "Tool",
    "ToolChoice",
    "ToolChoiceMode",
]

GA_PCM_SAMPLE_RATE_HZ: Final = 24000
G711_SAMPLE_RATE_HZ: Final = 8000
# GA allows only 24 kHz PCM; 16 kHz and 44.1 kHz (Ming's native output rate) are our extension.
PCM_SAMPLE_RATES_HZ: Final = (16000, 24000, 44100)
MAX_OUTPUT_TOKENS_LIMIT: Final = 4096


class Modality(StrEnum):
    """An output modality; `AUDIO` always comes with its transcript."""

    TEXT = "text"
    AUDIO = "audio"


class AudioEncoding(StrEnum):
    """GA audio format types."""

    PCM = "audio/pcm"
    PCMU = "audio/pcmu"
    PCMA = "audio/pcma"


_BETA_FORMAT_NAMES: Final = {
    "pcm16": AudioEncoding.PCM,
    "g711_ulaw": AudioEncoding.PCMU,
    "g711_alaw": AudioEncoding.PCMA,
}


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """Wire audio: 16-bit LE mono PCM at `sample_rate_hz`, or G.711 µ-law / A-law at 8 kHz."""

    encoding: AudioEncoding = AudioEncoding.PCM
    sample_rate_hz: int = GA_PCM_SAMPLE_RATE_HZ

    def __post_init__(self) -> None:
        allowed = PCM_SAMPLE_RATES_HZ if self.encoding is AudioEncoding.PCM else (G711_SAMPLE_RATE_HZ,)
        if self.sample_rate_hz not in allowed:
            raise ValueError(f"sample_rate_hz {self.sample_rate_hz} is invalid for {self.encoding.value}")

    @classmethod
    def pcmu(cls) -> AudioFormat:
        """G.711 µ-law at 8 kHz."""
        return cls(AudioEncoding.PCMU, G711_SAMPLE_RATE_HZ)

    @classmethod
    def pcma(cls) -> AudioFormat:
        """G.711 A-law at 8 kHz."""
        return cls(AudioEncoding.PCMA, G711_SAMPLE_RATE_HZ)

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """GA `{"type": "audio/pcm", "rate": 24000}`; beta `"pcm16"` (24 kHz PCM only)."""
        if dialect is Dialect.GA:
            if self.encoding is AudioEncoding.PCM:
                return {"type": self.encoding.value, "rate": self.sample_rate_hz}
            return {"type": self.encoding.value}
        if self.encoding is AudioEncoding.PCM and self.sample_rate_hz != GA_PCM_SAMPLE_RATE_HZ:
            raise ValueError(f"the beta dialect cannot express {self.sample_rate_hz} Hz PCM")
        return next(name for name, enc in _BETA_FORMAT_NAMES.items() if enc is self.encoding)


def _unsupported_format(param: str, name: str, dialect: Dialect) -> ProtocolError:
    supported = (
        ", ".join(_BETA_FORMAT_NAMES)
        if dialect is Dialect.BETA
        else ", ".join(encoding.value for encoding in AudioEncoding)
    )
    return ProtocolError(
        ErrorCode.UNSUPPORTED_AUDIO_FORMAT, param=param, audio_format=clip(name, MAX_QUOTE_CHARS), supported=supported
    )


def _decode_format(value: Any, param: str, dialect: Dialect) -> AudioFormat:
    if dialect is Dialect.BETA:
        name = expect_str(value, param)
        if name not in _BETA_FORMAT_NAMES:
            raise _unsupported_format(param, name, dialect)
        encoding = _BETA_FORMAT_NAMES[name]
        return AudioFormat() if encoding is AudioEncoding.PCM else AudioFormat(encoding, G711_SAMPLE_RATE_HZ)
    obj = expect_object(value, param)
    type_param = join(param, "type")
    name = expect_str(obj.get("type", AudioEncoding.PCM.value), type_param)
    if name not in AudioEncoding.__members__.values():
        raise _unsupported_format(type_param, name, dialect)
    encoding = AudioEncoding(name)
    default_rate = GA_PCM_SAMPLE_RATE_HZ if encoding is AudioEncoding.PCM else G711_SAMPLE_RATE_HZ
    rate_param = join(param, "rate")
    rate = expect_int(obj.get("rate", default_rate), rate_param)
    allowed = PCM_SAMPLE_RATES_HZ if encoding is AudioEncoding.PCM else (G711_SAMPLE_RATE_HZ,)
    if rate not in allowed:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            param=rate_param,
            rate=rate,
            supported=", ".join(str(r) for r in allowed),
        )
    return AudioFormat(encoding, rate)


AUDIO_FORMAT: Final[Codec[AudioFormat]] = Codec(_decode_format, lambda v, d: v.to_wire(d))


def _decode_modalities(value: Any, param: str, dialect: Dialect) -> tuple[Modality, ...]:
    names = {
        expect_choice(item, join(param, i), tuple(m.value for m in Modality))
        for i, item in enumerate(expect_list(value, param))
    }
    if not names:
        raise invalid_value(param, "at least one modality is required")
    if dialect is Dialect.GA and len(names) > 1:
        raise invalid_value(param, "GA sessions take either ['audio'] or ['text'], not both")
    return (Modality.AUDIO,) if Modality.AUDIO in names else (Modality.TEXT,)


def _encode_modalities(value: tuple[Modality, ...], dialect: Dialect) -> JsonValue:
    if dialect is Dialect.BETA and Modality.AUDIO in value:
        return [Modality.TEXT.value, Modality.AUDIO.value]
    return [modality.value for modality in value]


# GA `["audio"]` / `["text"]`; beta `["text", "audio"]` / `["text"]`. Stored as a 1-tuple.
MODALITIES: Final[Codec[tuple[Modality, ...]]] = Codec(_decode_modalities, _encode_modalities)


def _decode_voice(value: Any, param: str, _dialect: Dialect) -> str:
    if isinstance(value, dict):
        param = join(param, "id")
        value = value.get("id")
    voice = expect_text(value, param, MAX_NAME_CHARS, single_line=True)
    if not voice:
        raise invalid_value(param, "the voice must not be empty")
    return voice


# A voice name, or the GA custom-voice object `{"id": ...}`; always written as a string.
VOICE: Final[Codec[str]] = Codec(_decode_voice, lambda v, _d: v)


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """A function the model may call; `parameters` is its JSON schema, kept verbatim."""

    name: str
    description: str = ""
    parameters: Mapping[str, JsonValue] = field(default_factory=dict)

    def to_wire(self, _dialect: Dialect) -> JsonValue:
        """`{"type": "function", name, description, parameters}` in both dialects."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }


def _decode_tool(value: Any, param: str, dialect: Dialect) -> FunctionTool | McpTool:
    obj = expect_object(value, param)
    kind = expect_str(obj.get("type", "function"), join(param, "type"))
    if kind == "mcp":
        return decode_mcp_tool(obj, param, dialect)
    if kind != "function":
        raise invalid_value(join(param, "type"), f"tools are 'function' or 'mcp' tools, got {quote(kind)}")
    name = expect_text(obj.get("name"), join(param, "name"), MAX_NAME_CHARS, single_line=True)
    if not name:
        raise invalid_value(join(param, "name"), "the tool name must not be empty")
    raw_description = obj.get("description")
    description = (
        ""
        if raw_description is None
        else expect_text(raw_description, join(param, "description"), MAX_DESCRIPTION_CHARS)
    )
    parameters = obj.get("parameters")
    if parameters is not None:
        expect_object(parameters, join(param, "parameters"))
        expect_bounded_json(parameters, join(param, "parameters"), MAX_SCHEMA_JSON_BYTES)
    return FunctionTool(name, description, parameters or {})


Tool: TypeAlias = FunctionTool | McpTool


def _decode_tools(value: Any, param: str, dialect: Dialect) -> tuple[Tool, ...]:
    items = expect_list(value, param, MAX_TOOLS)
    check_tools_size(items, param)  # before any tool is decoded
    tools = tuple(_decode_tool(item, join(param, i), dialect) for i, item in enumerate(items))
    names = [(tool.name, "name") if isinstance(tool, FunctionTool) else (tool.server_label, "server_label")
             for tool in tools]
    for index, (name, key) in enumerate(names):
        if (name, key) in names[:index]:
            raise invalid_value(join(join(param, index), key), f"duplicate tool {key} '{name}'")
    return tools


TOOLS: Final[Codec[tuple[Tool, ...]]] = Codec(_decode_tools, lambda v, d: [t.to_wire(d) for t in v])


class ToolChoiceMode(StrEnum):
    """String tool-choice modes."""

    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class FunctionChoice:
    """Force a call of the named function."""

    name: str


ToolChoice: TypeAlias = ToolChoiceMode | FunctionChoice


def _decode_tool_choice(value: Any, param: str, dialect: Dialect) -> ToolChoice:
    modes = tuple(mode.value for mode in ToolChoiceMode)
    if isinstance(value, str):
        if value in modes:
            return ToolChoiceMode(value)
        if dialect is Dialect.BETA and value:
            return FunctionChoice(expect_text(value, param, MAX_NAME_CHARS, single_line=True))  # beta names a forced function by a bare string
        raise invalid_value(param, f"{quote(value)} is not one of {', '.join(modes)}")
    obj = expect_object(value, param)
    expect_choice(obj.get("type"), join(param, "type"), ("function",))
    name = expect_text(obj.get("name"), join(param, "name"), MAX_NAME_CHARS, single_line=True)
    return FunctionChoice(name)


def _encode_tool_choice(value: ToolChoice, dialect: Dialect) -> JsonValue:
    if isinstance(value, ToolChoiceMode):
        return value.value
    return {"type": "function", "name": value.name} if dialect is Dialect.GA else value.name


TOOL_CHOICE: Final[Codec[ToolChoice]] = Codec(_decode_tool_choice, _encode_tool_choice)

MaxOutputTokens: TypeAlias = int | Literal["inf"]


def _decode_max_tokens(value: Any, param: str, _dialect: Dialect) -> MaxOutputTokens:
    if value == "inf":
        return "inf"
    if isinstance(value, str):
        raise invalid_value(param, f"{quote(value)} is neither an integer nor 'inf'")
    return expect_int(value, param, minimum=1, maximum=MAX_OUTPUT_TOKENS_LIMIT)


MAX_OUTPUT_TOKENS: Final[Codec[MaxOutputTokens]] = Codec(_decode_max_tokens, lambda v, _d: v)


def _decode_metadata(value: Any, param: str, _dialect: Dialect) -> Mapping[str, str]:
    obj = expect_object(value, param)
    if len(obj) > MAX_METADATA_PAIRS:
        raise ProtocolError(
            ErrorCode.OBJECT_ABOVE_MAX_PROPERTIES, param=param, length=len(obj), max_length=MAX_METADATA_PAIRS
        )
    for key in obj:
        expect_text(key, join(param, clip(key, MAX_QUOTE_CHARS)), MAX_METADATA_KEY_CHARS)
    return {key: expect_text(item, join(param, key), MAX_METADATA_VALUE_CHARS) for key, item in obj.items()}


METADATA: Final[Codec[Mapping[str, str]]] = Codec(_decode_metadata, lambda v, _d: dict(v))
