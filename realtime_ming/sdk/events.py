"""Server frames → typed `protocol` server events: the client-side inverse of `protocol.serialise`.

`parse_server_event` reads a GA or beta frame into the registered GA event class, so the SDK
hands applications the same objects the session produced (`ResponseOutputAudioDelta`, …).
Server objects are read leniently where the server legitimately differs from what a client may
send (empty assistant content, audio parts without audio, beta temperature 0); anything that is
not a server event raises `ProtocolViolation`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields, replace
from typing import Any, Final

from ..protocol.dialect import Dialect, content_type_from_wire, server_type_to_wire
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.events import SERVER_EVENTS, ServerEvent
from ..protocol.items import (
    ContentPart,
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    ImageDetail,
    InputAudio,
    InputImage,
    InputText,
    InputVideo,
    ItemStatus,
    MessageItem,
    OutputAudio,
    OutputText,
    Role,
)
from ..protocol.responses import (
    Conversation,
    ErrorDetail,
    RateLimit,
    RateLimitName,
    Response,
    ResponseStatus,
    StatusDetails,
    StatusReason,
    TranscriptionDurationUsage,
    TranscriptionTokenUsage,
    TranscriptionUsage,
    Usage,
)
from ..protocol.session import SessionConfig, apply_update
from ..protocol.values import (
    AUDIO_FORMAT,
    MAX_OUTPUT_TOKENS,
    METADATA,
    MODALITIES,
    VOICE,
)
from ..protocol.wire import (
    expect_choice,
    expect_int,
    expect_list,
    expect_number,
    expect_object,
    expect_str,
    invalid_value,
    join,
)
from .errors import ProtocolViolation

__all__ = ["parse_server_event"]

# Wire name in each dialect -> GA event class (beta renames a few; see protocol.dialect).
_CLASSES_BY_WIRE: Final = {
    dialect: {
        wire: cls
        for ga_type, cls in SERVER_EVENTS.items()
        if (wire := server_type_to_wire(ga_type, dialect)) is not None
    }
    for dialect in Dialect
}


def _opt_str(obj: Mapping[str, Any], key: str, param: str) -> str | None:
    value = obj.get(key)
    return None if value is None else expect_str(value, join(param, key))


def _enum(enum_type: Any, value: Any, param: str) -> Any:
    return enum_type(expect_choice(value, param, tuple(member.value for member in enum_type)))


def _opt_enum(enum_type: Any, obj: Mapping[str, Any], key: str, param: str) -> Any:
    value = obj.get(key)
    return None if value is None else _enum(enum_type, value, join(param, key))


def _part(value: Any, param: str, _dialect: Dialect) -> ContentPart:
    obj = expect_object(value, param)
    kind = content_type_from_wire(expect_str(obj.get("type"), join(param, "type")))
    if kind in (InputText.type, OutputText.type):
        text_cls = InputText if kind == InputText.type else OutputText
        return text_cls(expect_str(obj.get("text"), join(param, "text")))
    if kind == InputImage.type and "video" in obj:  # a stored `input_video` clip (docs/protocol.md §4.1)
        video = expect_object(obj["video"], join(param, "video"))
        frames, duration = video.get("num_frames"), video.get("duration_s")
        return InputVideo(num_frames=None if frames is None else int(frames),
                          duration_s=None if duration is None else float(duration))
    if kind == InputImage.type:
        url = expect_str(obj.get("image_url"), join(param, "image_url"))
        return InputImage(url, _opt_enum(ImageDetail, obj, "detail", param))
    if kind in (InputAudio.type, OutputAudio.type):
        audio_cls = InputAudio if kind == InputAudio.type else OutputAudio
        return audio_cls(audio=_opt_str(obj, "audio", param), transcript=_opt_str(obj, "transcript", param))
    raise invalid_value(join(param, "type"), f"unknown content type '{kind}'")


def _item(value: Any, param: str, dialect: Dialect) -> ConversationItem:
    obj = expect_object(value, param)
    kind = expect_choice(obj.get("type"), join(param, "type"), ("message", "function_call", "function_call_output"))
    item_id = _opt_str(obj, "id", param)
    status = _opt_enum(ItemStatus, obj, "status", param)
    if kind == "message":
        content_param = join(param, "content")
        parts = expect_list(obj.get("content", []), content_param)
        return MessageItem(
            role=_enum(Role, obj.get("role"), join(param, "role")),
            content=tuple(_part(p, join(content_param, i), dialect) for i, p in enumerate(parts)),
            id=item_id,
            status=status,
        )
    if kind == "function_call":
        return FunctionCallItem(
            name=expect_str(obj.get("name"), join(param, "name")),
            arguments=expect_str(obj.get("arguments"), join(param, "arguments")),
            call_id=_opt_str(obj, "call_id", param),
            id=item_id,
            status=status,
        )
    return FunctionCallOutputItem(
        call_id=expect_str(obj.get("call_id"), join(param, "call_id")),
        output=expect_str(obj.get("output"), join(param, "output")),
        id=item_id,
        status=status,
    )


def _error_detail(value: Any, param: str, _dialect: Dialect) -> ErrorDetail:
    obj = expect_object(value, param)
    return ErrorDetail(
        type=expect_str(obj.get("type"), join(param, "type")),
        message=expect_str(obj.get("message"), join(param, "message")),
        code=_opt_str(obj, "code", param),
        param=_opt_str(obj, "param", param),
        event_id=_opt_str(obj, "event_id", param),
    )


def _usage(value: Any, param: str) -> Usage:
    obj = expect_object(value, param)
    inp = expect_object(obj.get("input_token_details", {}), join(param, "input_token_details"))
    out = expect_object(obj.get("output_token_details", {}), join(param, "output_token_details"))

    cached = expect_object(inp.get("cached_tokens_details", {}), join(param, "input_token_details.cached_tokens_details"))

    def count(details: Mapping[str, Any], key: str, where: str) -> int:
        return expect_int(details.get(key, 0), join(join(param, where), key), minimum=0)

    return Usage(
        input_text_tokens=count(inp, "text_tokens", "input_token_details"),
        input_audio_tokens=count(inp, "audio_tokens", "input_token_details"),
        input_image_tokens=count(inp, "image_tokens", "input_token_details"),
        input_cached_tokens=count(inp, "cached_tokens", "input_token_details"),
        output_text_tokens=count(out, "text_tokens", "output_token_details"),
        output_audio_tokens=count(out, "audio_tokens", "output_token_details"),
        input_cached_text_tokens=count(cached, "text_tokens", "input_token_details.cached_tokens_details"),
        input_cached_audio_tokens=count(cached, "audio_tokens", "input_token_details.cached_tokens_details"),
        input_cached_image_tokens=count(cached, "image_tokens", "input_token_details.cached_tokens_details"),
    )


def _status_details(value: Any, param: str, dialect: Dialect) -> StatusDetails:
    obj = expect_object(value, param)
    error = obj.get("error")
    return StatusDetails(
        type=_enum(ResponseStatus, obj.get("type"), join(param, "type")),
        reason=_opt_enum(StatusReason, obj, "reason", param),
        error=None if error is None else _error_detail(error, join(param, "error"), dialect),
    )


def _response(value: Any, param: str, dialect: Dialect) -> Response:
    obj = expect_object(value, param)
    if dialect is Dialect.GA:
        output = expect_object(expect_object(obj.get("audio", {}), join(param, "audio")).get("output", {}),
                               join(param, "audio.output"))
        modalities, fmt, voice = obj.get("output_modalities"), output.get("format"), output.get("voice")
        fmt_param = join(param, "audio.output.format")
    else:
        modalities, fmt, voice = obj.get("modalities"), obj.get("output_audio_format"), obj.get("voice")
        fmt_param = join(param, "output_audio_format")
    optional: dict[str, Any] = {}
    if modalities is not None:
        optional["output_modalities"] = MODALITIES.decode(modalities, join(param, "modalities"), dialect)
    if fmt is not None:
        optional["output_format"] = AUDIO_FORMAT.decode(fmt, fmt_param, dialect)
    if obj.get("max_output_tokens") is not None:
        optional["max_output_tokens"] = MAX_OUTPUT_TOKENS.decode(
            obj["max_output_tokens"], join(param, "max_output_tokens"), dialect
        )
    details, usage, metadata = obj.get("status_details"), obj.get("usage"), obj.get("metadata")
    temperature = obj.get("temperature")
    output_param = join(param, "output")
    return Response(
        id=expect_str(obj.get("id"), join(param, "id")),
        voice=VOICE.decode(voice, join(param, "voice"), dialect),
        status=_enum(ResponseStatus, obj.get("status"), join(param, "status")),
        status_details=None if details is None else _status_details(details, join(param, "status_details"), dialect),
        output=tuple(_item(item, join(output_param, i), dialect)
                     for i, item in enumerate(expect_list(obj.get("output", []), output_param))),
        usage=None if usage is None else _usage(usage, join(param, "usage")),
        conversation_id=_opt_str(obj, "conversation_id", param),
        metadata=None if metadata is None else METADATA.decode(metadata, join(param, "metadata"), dialect),
        temperature=None if temperature is None else expect_number(temperature, join(param, "temperature")),
        **optional,
    )


def _session(value: Any, param: str, dialect: Dialect) -> SessionConfig:
    obj = dict(expect_object(value, param))
    # The server may run below the client-settable temperature range (0 = greedy): read it as is.
    temperature = obj.pop("temperature", None)
    config = apply_update(SessionConfig(id=expect_str(obj.get("id"), join(param, "id"))), obj, dialect)
    if temperature is not None:
        config = replace(config, temperature=expect_number(temperature, join(param, "temperature")))
    return config


def _conversation(value: Any, param: str, _dialect: Dialect) -> Conversation:
    return Conversation(expect_str(expect_object(value, param).get("id"), join(param, "id")))


def _rate_limits(value: Any, param: str, _dialect: Dialect) -> tuple[RateLimit, ...]:
    limits = []
    for i, raw in enumerate(expect_list(value, param)):
        where = join(param, i)
        obj = expect_object(raw, where)
        limits.append(RateLimit(
            name=_enum(RateLimitName, obj.get("name"), join(where, "name")),
            limit=expect_int(obj.get("limit"), join(where, "limit")),
            remaining=expect_int(obj.get("remaining"), join(where, "remaining")),
            reset_seconds=expect_number(obj.get("reset_seconds"), join(where, "reset_seconds")),
        ))
    return tuple(limits)


def _transcription_usage(value: Any, param: str, _dialect: Dialect) -> TranscriptionUsage:
    obj = expect_object(value, param)
    kind = expect_choice(obj.get("type"), join(param, "type"), ("tokens", "duration"))
    if kind == "duration":
        return TranscriptionDurationUsage(expect_number(obj.get("seconds"), join(param, "seconds")))
    return TranscriptionTokenUsage(
        expect_int(obj.get("input_tokens"), join(param, "input_tokens")),
        expect_int(obj.get("output_tokens"), join(param, "output_tokens")),
    )


def _timings(value: Any, param: str, _dialect: Dialect) -> dict[str, float]:
    obj = expect_object(value, param)
    return {key: expect_number(item, join(param, key)) for key, item in obj.items()}


_Decoder = Callable[[Any, str, Dialect], Any]

# Structured fields, by name (each name has one meaning across all server events).
_STRUCTURED: Final[dict[str, _Decoder]] = {
    "error": _error_detail,
    "session": _session,
    "conversation": _conversation,
    "item": _item,
    "response": _response,
    "rate_limits": _rate_limits,
    "usage": _transcription_usage,
    "part": _part,
    "timings": _timings,
}
# Scalar fields, by their annotation (the event classes use postponed annotations).
_SCALARS: Final[dict[str, _Decoder]] = {
    "str": lambda v, p, _d: expect_str(v, p),
    "int": lambda v, p, _d: expect_int(v, p),
    "str | None": lambda v, p, _d: None if v is None else expect_str(v, p),
}


def _decode_event(cls: type[ServerEvent], obj: Mapping[str, Any], dialect: Dialect) -> ServerEvent:
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in obj:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ProtocolError(ErrorCode.INVALID_EVENT, param=f.name, detail=f"missing field '{f.name}'")
            continue
        decode = _STRUCTURED.get(f.name) or _SCALARS[str(f.type)]
        values[f.name] = decode(obj[f.name], f.name, dialect)
    return cls(**values)


def parse_server_event(frame: str | bytes | Mapping[str, Any], dialect: Dialect = Dialect.GA) -> ServerEvent:
    """Read one server frame (JSON text or an already-decoded object) of `dialect`.

    Returns the registered GA event class for the frame's type, beta names included
    (`response.audio.delta` → `ResponseOutputAudioDelta`). Raises `ProtocolViolation` for
    invalid JSON, a missing or unknown `type`, or a field of the wrong shape.
    """
    if isinstance(frame, Mapping):
        obj: Any = frame
    else:
        try:
            obj = json.loads(frame)
        except ValueError as exc:
            raise ProtocolViolation(f"server frame is not JSON: {exc}", frame) from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        raise ProtocolViolation("server frame is not an object with a string 'type'", _raw(frame))
    cls = _CLASSES_BY_WIRE[dialect].get(obj["type"])
    if cls is None:
        raise ProtocolViolation(f"unknown server event type {obj['type']!r} ({dialect.value})", _raw(frame))
    try:
        return _decode_event(cls, obj, dialect)
    except (ProtocolError, ValueError, TypeError) as exc:
        raise ProtocolViolation(f"malformed {obj['type']} event: {exc}", _raw(frame)) from exc


def _raw(frame: str | bytes | Mapping[str, Any]) -> str | bytes | None:
    return None if isinstance(frame, Mapping) else frame
