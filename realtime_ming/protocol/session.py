"""The effective session (`SessionConfig`) and `session.update` semantics (`docs/protocol.md` §3).

One field table per dialect maps `SessionConfig` attributes to wire paths (GA nested
`audio.input.format`, beta flat `input_audio_format`); it drives both `parse_session_update` and
`session_to_wire`. Updates are partial: only fields present change; `""` clears instructions,
`[]` clears tools, `null` clears turn detection / transcription / noise reduction. Nested
objects (a format, turn detection, transcription) are replaced as a whole, missing sub-fields
taking their defaults. Any bad value raises `ProtocolError` before anything changes.
Extension: `realtime_ming: {"timing_events": true}` opts in to `realtime_ming.response.timings`;
`realtime_ming: {"speech": {...}}` sets the talker's speech style (`protocol/speech_style.py`);
`realtime_ming: {"output_lead_ms": 200}` bounds the unplayed reply audio a client holds (null: unpaced) and
`realtime_ming: {"output_audio_buffer": true}` opts in to the GA `output_audio_buffer.*` playout events.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Final

from realtime_ming.protocol.audio_input import (
    DEFAULT_NOISE_REDUCTION_STRENGTH,
    NOISE_REDUCTION,
    TRANSCRIPTION,
    TURN_DETECTION,
    InputTranscription,
    NoiseReduction,
    ServerVad,
    TurnDetection,
)
from realtime_ming.protocol.dialect import Dialect
from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import MAX_QUOTE_CHARS, ProtocolError, clip
from realtime_ming.protocol.ids import IdPrefix, new_id
from realtime_ming.protocol.known_keys import check_known_keys
from realtime_ming.protocol.limits import (
    MAX_ECHO_JSON_BYTES,
    MAX_METADATA_VALUE_CHARS,
    MAX_TEXT_CHARS,
)
from realtime_ming.protocol.speech_style import SPEECH_STYLE, SpeechStyle
from realtime_ming.protocol.unsupported import refuse_prompt, refuse_unsupported
from realtime_ming.protocol.values import (
    AUDIO_FORMAT,
    MAX_OUTPUT_TOKENS,
    MODALITIES,
    TOOL_CHOICE,
    TOOLS,
    VOICE,
    AudioFormat,
    Tool,
    MaxOutputTokens,
    Modality,
    ToolChoice,
    ToolChoiceMode,
)
from realtime_ming.protocol.wire import (
    BOOL,
    ID,
    Codec,
    JsonValue,
    WireField,
    decode_fields,
    encode_attributes,
    encode_fields,
    expect_bounded_json,
    expect_choice,
    expect_int,
    expect_list,
    expect_number,
    expect_object,
    expect_str,
    expect_text,
    invalid_value,
    join,
    nullable,
    number_codec,
    quote,
)

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_VOICE",
    "SESSION_PATCH",
    "SPEED",
    "TEMPERATURE",
    "SessionConfig",
    "SessionPatch",
    "SessionType",
    "apply_patch",
    "apply_update",
    "parse_session_update",
    "session_to_wire",
]

DEFAULT_MODEL: Final = "Ming-flash-omni-2.0"
DEFAULT_VOICE: Final = "DB30"  # Ming's default talker voice (docs/model.md §5.4)


class SessionType(StrEnum):
    """GA `session.type`: a `realtime` session converses; a `transcription` session only transcribes the
    committed audio (`input_audio_buffer.committed` -> `conversation.item.input_audio_transcription.*`)."""

    REALTIME = "realtime"
    TRANSCRIPTION = "transcription"


SPEED: Final = number_codec(0.25, 1.5)
TEMPERATURE: Final = number_codec(0.6, 1.2)


def _decode_instructions(value: Any, param: str, _dialect: Dialect) -> str:
    return "" if value is None else expect_text(value, param, MAX_TEXT_CHARS)


def _decode_tools_or_null(value: Any, param: str, dialect: Dialect) -> tuple[Tool, ...]:
    return () if value is None else TOOLS.decode(value, param, dialect)


def _decode_tracing(value: Any, param: str, _dialect: Dialect) -> str | Mapping[str, JsonValue] | None:
    if value is None or value == "auto":
        return value
    if isinstance(value, str):
        raise invalid_value(param, f"{quote(value)} is neither 'auto' nor a tracing object")
    obj = expect_object(value, param)
    for key in ("group_id", "workflow_name"):  # `metadata` is any JSON
        if obj.get(key) is not None:
            expect_text(obj[key], join(param, key), MAX_METADATA_VALUE_CHARS, single_line=True)
    return _echoed(obj, param)


def _decode_truncation(value: Any, param: str, _dialect: Dialect) -> str | Mapping[str, JsonValue]:
    if isinstance(value, str):
        return expect_choice(value, param, ("auto", "disabled"))
    obj = expect_object(value, param)
    expect_choice(obj.get("type"), join(param, "type"), ("retention_ratio",))
    expect_number(obj.get("retention_ratio"), join(param, "retention_ratio"), minimum=0.0, maximum=1.0)
    for key in obj.keys() - {"type", "retention_ratio", "token_limits"}:
        raise invalid_value(join(param, key), "not a retention_ratio truncation field")
    limits = obj.get("token_limits")
    if limits is not None:
        limits = expect_object(limits, join(param, "token_limits"))
        for key in limits.keys() - {"post_instructions"}:
            raise invalid_value(join(join(param, "token_limits"), key), "not a token limit")
        if limits.get("post_instructions") is not None:
            expect_int(limits["post_instructions"], join(join(param, "token_limits"), "post_instructions"), minimum=1)
    return _echoed(obj, param)


def _decode_include(value: Any, param: str, _dialect: Dialect) -> tuple[str, ...]:
    allowed = ("item.input_audio_transcription.logprobs",)
    items = expect_list(value, param, len(allowed))
    values = tuple(expect_choice(v, join(param, i), allowed) for i, v in enumerate(items))
    if values:  # the one documented value asks for transcription logprobs, which this server does not produce
        raise ProtocolError(ErrorCode.UNSUPPORTED_PARAMETER, param=join(param, 0),
                            detail="input transcription logprobs are not produced; send [] or null")
    return values


def _echoed(value: Any, param: str) -> Mapping[str, JsonValue]:
    """A free-form object that is only echoed: bounded in size, copied as plain JSON."""
    return _plain(expect_bounded_json(expect_object(value, param), param, MAX_ECHO_JSON_BYTES))


def _plain(value: Any, _dialect: Dialect | None = None) -> JsonValue:
    """A fresh plain-JSON copy (dicts and lists) of an echoed value."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return value


_INSTRUCTIONS = Codec(_decode_instructions, lambda v, _d: v)
_TOOLS = Codec(_decode_tools_or_null, TOOLS.encode)
# Echo-through GA extras: validated lightly, stored and rendered verbatim.
_TRACING = Codec(_decode_tracing, _plain)
_TRUNCATION = Codec(_decode_truncation, _plain)
_INCLUDE = nullable(Codec(_decode_include, _plain))
_PROMPT = Codec(refuse_prompt, _plain)  # only `null` / `{}` get through: always echoed as null


# The most unplayed reply audio a client holds by default (ms): the server paces its audio deltas to it, so that
# the output hold at a possible interruption is heard within it (docs/barge_in.md has the measurement).
DEFAULT_OUTPUT_LEAD_MS: Final = 150
OUTPUT_LEAD_RANGE_MS: Final = (40, 60_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    """The full effective session of one connection (dialect-free, GA semantics).

    `output_modalities` is `(AUDIO,)` (audio plus transcript) or `(TEXT,)`. `temperature` is
    beta-only on the wire. `truncation` is applied by the engine (`engine.api.Truncation`);
    `model` is always the served model (a requested name is validated and
    reported back as the served one). `tracing` is logged per response (`session.tracing`);
    `include` and `prompt` only take their empty values (anything else is `unsupported_parameter`).
    `timing_events` is our opt-in for `realtime_ming.response.timings`; `speech` (with `speed`) is
    the talker's speech style (`realtime_ming.speech`, replaced as a whole, `null` clears).
    """

    id: str = field(default_factory=lambda: new_id(IdPrefix.SESSION))
    model: str = DEFAULT_MODEL
    instructions: str = ""
    output_modalities: tuple[Modality, ...] = (Modality.AUDIO,)
    input_format: AudioFormat = AudioFormat()
    output_format: AudioFormat = AudioFormat()
    voice: str = DEFAULT_VOICE
    speed: float = 1.0
    turn_detection: TurnDetection = ServerVad()
    transcription: InputTranscription | None = None
    noise_reduction: NoiseReduction | None = None
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoiceMode.AUTO
    max_output_tokens: MaxOutputTokens = "inf"
    temperature: float = 0.8
    tracing: str | Mapping[str, JsonValue] | None = None
    truncation: str | Mapping[str, JsonValue] = "auto"
    include: tuple[str, ...] | None = None
    prompt: Mapping[str, JsonValue] | None = None
    timing_events: bool = False
    session_type: SessionType = SessionType.REALTIME
    speech: SpeechStyle | None = None
    output_lead_ms: int | None = DEFAULT_OUTPUT_LEAD_MS
    output_audio_buffer: bool = False

    def to_wire(self, dialect: Dialect) -> dict[str, JsonValue]:
        """Same as `session_to_wire(self, dialect)`."""
        return session_to_wire(self, dialect)

    @classmethod
    def from_wire(cls, value: Any, param: str, dialect: Dialect) -> SessionConfig:
        """The inverse of `session_to_wire`, through the same field table; fields `dialect` does not carry
        keep their defaults. Server values are read as written (a temperature of 0 = greedy is kept)."""
        obj = expect_object(value, param)
        if dialect is Dialect.GA and obj.get("type") == SessionType.TRANSCRIPTION:
            values = decode_fields(obj, _TRANSCRIPTION_SESSION_FIELDS, dialect, param)
            return cls(id=expect_str(obj.get("id"), join(param, "id")), session_type=SessionType.TRANSCRIPTION,
                       **values)
        table = tuple(f for f in _SESSION_FIELDS[dialect] if f.name != "temperature")
        values = decode_fields(obj, table, dialect, param)
        if obj.get("temperature") is not None:
            values["temperature"] = expect_number(obj["temperature"], join(param, "temperature"))
        return cls(id=expect_str(obj.get("id"), join(param, "id")), **values)

    @property
    def is_audio_output(self) -> bool:
        """Whether responses speak (audio + transcript) rather than write text."""
        return Modality.AUDIO in self.output_modalities


_TIMING_EVENTS = WireField.at("timing_events", BOOL, "realtime_ming.timing_events")
_SPEECH = WireField.at("speech", nullable(SPEECH_STYLE), "realtime_ming.speech")
_LEAD_MS = Codec(lambda v, p, _d: expect_int(v, p, minimum=OUTPUT_LEAD_RANGE_MS[0], maximum=OUTPUT_LEAD_RANGE_MS[1]),
                 _plain)
_OUTPUT_LEAD = WireField.at("output_lead_ms", nullable(_LEAD_MS), "realtime_ming.output_lead_ms")
_OUTPUT_AUDIO_BUFFER = WireField.at("output_audio_buffer", BOOL, "realtime_ming.output_audio_buffer")
_SESSION_FIELDS: Final[dict[Dialect, tuple[WireField, ...]]] = {
    Dialect.GA: (
        WireField.at("model", ID),
        WireField.at("instructions", _INSTRUCTIONS),
        WireField.at("output_modalities", MODALITIES),
        WireField.at("input_format", AUDIO_FORMAT, "audio.input.format"),
        WireField.at("transcription", nullable(TRANSCRIPTION), "audio.input.transcription"),
        WireField.at("noise_reduction", nullable(NOISE_REDUCTION), "audio.input.noise_reduction"),
        WireField.at("turn_detection", nullable(TURN_DETECTION), "audio.input.turn_detection"),
        WireField.at("output_format", AUDIO_FORMAT, "audio.output.format"),
        WireField.at("voice", VOICE, "audio.output.voice"),
        WireField.at("speed", SPEED, "audio.output.speed"),
        WireField.at("tools", _TOOLS),
        WireField.at("tool_choice", TOOL_CHOICE),
        WireField.at("max_output_tokens", MAX_OUTPUT_TOKENS),
        WireField.at("tracing", _TRACING),
        WireField.at("truncation", _TRUNCATION),
        WireField.at("include", _INCLUDE),
        WireField.at("prompt", _PROMPT),
        _TIMING_EVENTS,
        _SPEECH,
        _OUTPUT_LEAD,
        _OUTPUT_AUDIO_BUFFER,
    ),
    Dialect.BETA: (
        WireField.at("model", ID),
        WireField.at("instructions", _INSTRUCTIONS),
        WireField.at("output_modalities", MODALITIES, "modalities"),
        WireField.at("input_format", AUDIO_FORMAT, "input_audio_format"),
        WireField.at("transcription", nullable(TRANSCRIPTION), "input_audio_transcription"),
        WireField.at("noise_reduction", nullable(NOISE_REDUCTION), "input_audio_noise_reduction"),
        WireField.at("turn_detection", nullable(TURN_DETECTION)),
        WireField.at("output_format", AUDIO_FORMAT, "output_audio_format"),
        WireField.at("voice", VOICE),
        WireField.at("speed", SPEED),
        WireField.at("tools", _TOOLS),
        WireField.at("tool_choice", TOOL_CHOICE),
        WireField.at("max_output_tokens", MAX_OUTPUT_TOKENS, "max_response_output_tokens"),
        WireField.at("temperature", TEMPERATURE),
        WireField.at("tracing", _TRACING),
        _TIMING_EVENTS,
        _SPEECH,
        _OUTPUT_LEAD,
        _OUTPUT_AUDIO_BUFFER,
    ),
}


# The GA transcription session (`RealtimeTranscriptionSessionCreateRequest`): audio input and `include` only.
TRANSCRIPTION_SESSION_NAMES: Final = frozenset(
    {"input_format", "transcription", "noise_reduction", "turn_detection", "include"}
)
_TRANSCRIPTION_SESSION_FIELDS: Final = tuple(
    f for f in _SESSION_FIELDS[Dialect.GA] if f.name in TRANSCRIPTION_SESSION_NAMES
)


@dataclass(frozen=True, slots=True)
class SessionPatch:
    """A validated `session.update`: `SessionConfig` attribute -> new typed value, for the
    fields the client sent (in `dialect`). Apply with `apply_patch`."""

    changes: Mapping[str, Any]
    dialect: Dialect

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """The update as a client would send it (fields absent from `dialect` are left out)."""
        wire = encode_fields(self.changes, _SESSION_FIELDS[dialect], dialect)
        session_type = self.changes.get("session_type", SessionType.REALTIME)
        return {"type": session_type.value, **wire} if dialect is Dialect.GA else wire

    def param(self, name: str) -> str:
        """Wire param path of attribute `name` in this patch's dialect, e.g. `session.voice`."""
        path = next(f.path for f in _SESSION_FIELDS[self.dialect] if f.name == name)
        return ".".join(("session", *path))


def _session_type(obj: Mapping[str, Any], param: str) -> SessionType | None:
    """The GA `session.type` of an update (`None`: not sent, the type stays)."""
    if "type" not in obj:
        return None
    type_param = join(param, "type")
    session_type = expect_str(obj["type"], type_param)
    if session_type not in tuple(SessionType):
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SESSION_TYPE, param=type_param, session_type=clip(session_type, MAX_QUOTE_CHARS)
        )
    return SessionType(session_type)


def parse_session_update(value: Any, dialect: Dialect, param: str = "session") -> SessionPatch:
    """Validate the `session` object of a `session.update`; raises `ProtocolError`.

    A key the openai types of `dialect` do not define (a typo, the other dialect's shape) is
    `unknown_parameter` naming its path (`known_keys`).
    """
    obj = expect_object(value, param)
    changes = {}
    if dialect is Dialect.GA:
        session_type = _session_type(obj, param)
        if session_type is not None:
            changes["session_type"] = session_type
        refuse_unsupported(obj, param, dialect)
    values = decode_fields(obj, _SESSION_FIELDS[dialect], dialect, param)
    check_known_keys(obj, dialect, "session.update", "session")
    return SessionPatch({**values, **changes}, dialect)


def apply_patch(
    current: SessionConfig, patch: SessionPatch, *, voices: Collection[str] | None = None
) -> SessionConfig:
    """Return `current` with `patch` applied; `voices` (if given) lists the accepted voices.

    Raises `ProtocolError` (`unknown_voice`; `realtime_only_parameter` for a field a transcription session
    does not have, `invalid_value` for turning its transcription off) without any change.
    """
    if patch.changes.get("session_type", current.session_type) is SessionType.TRANSCRIPTION:
        _check_transcription_patch(patch, patch.changes.get("turn_detection", current.turn_detection))
    voice = patch.changes.get("voice")
    if voices is not None and voice is not None and voice not in voices:
        raise ProtocolError(
            ErrorCode.UNKNOWN_VOICE, param=patch.param("voice"), voice=voice, voices=", ".join(sorted(voices))
        )
    changes = {k: v for k, v in patch.changes.items() if k != "model"}
    reduction = changes.get("noise_reduction")
    if reduction is not None and reduction.strength is None:  # left out: the current strength stays
        kept = current.noise_reduction.strength if current.noise_reduction is not None else None
        changes["noise_reduction"] = replace(
            reduction, strength=DEFAULT_NOISE_REDUCTION_STRENGTH if kept is None else kept)
    # The served model is fixed: clients name theirs ("gpt-realtime") and read the served one back.
    return replace(current, **changes)


def apply_update(
    current: SessionConfig,
    update: Mapping[str, Any],
    dialect: Dialect,
    *,
    voices: Collection[str] | None = None,
) -> SessionConfig:
    """Validate the wire `session` object `update` and apply it to `current` (docs/protocol.md §3.4).

    Raises `ProtocolError` carrying the code and param path; `current` is never modified (it is
    immutable, and a new config is returned only when every field is valid).
    """
    return apply_patch(current, parse_session_update(update, dialect), voices=voices)


def _check_transcription_patch(patch: SessionPatch, turn_detection: TurnDetection) -> None:
    if isinstance(turn_detection, ServerVad) and turn_detection.idle_timeout_ms is not None:
        # it prompts a reply after silence; a transcription session has none
        raise ProtocolError(ErrorCode.REALTIME_ONLY_PARAMETER, param=patch.param("turn_detection") + ".idle_timeout_ms")
    for name in sorted(patch.changes.keys() - TRANSCRIPTION_SESSION_NAMES - {"session_type"}):
        raise ProtocolError(ErrorCode.REALTIME_ONLY_PARAMETER, param=patch.param(name))
    if "transcription" in patch.changes and patch.changes["transcription"] is None:
        raise invalid_value(patch.param("transcription"), "a transcription session always transcribes;"
                            " send a transcription object (or leave it out for the served model's ASR)")


def session_to_wire(config: SessionConfig, dialect: Dialect) -> dict[str, JsonValue]:
    """The full effective session: GA nested shape with `type: "realtime"`, or beta flat shape.

    Raises `ValueError` for beta when the config uses a PCM rate other than 24 kHz.
    """
    if config.session_type is SessionType.TRANSCRIPTION and dialect is Dialect.GA:
        header = {"type": config.session_type.value, "id": config.id, "object": "realtime.transcription_session"}
        return {**header, **encode_attributes(config, _TRANSCRIPTION_SESSION_FIELDS, dialect, skip_none=False)}
    table = _SESSION_FIELDS[dialect]
    if dialect is Dialect.BETA:
        # The beta SDK types `session.model` as a literal list of OpenAI model ids; leave ours out.
        table = tuple(f for f in table if f.name != "model")
    header: dict[str, JsonValue] = {"id": config.id, "object": "realtime.session"}
    if dialect is Dialect.GA:
        header = {"type": "realtime", **header}
    return {**header, **encode_attributes(config, table, dialect, skip_none=False)}


SESSION_PATCH: Final[Codec[SessionPatch]] = Codec(
    lambda v, p, d: parse_session_update(v, d, p), lambda v, d: v.to_wire(d)
)
