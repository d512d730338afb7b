"""The only ways in and out: `parse` (text frame -> client event) and `serialise` (server event -> text).

`parse` never raises on client input: every bad frame becomes a `ProtocolError` with a stable
code, the `param` path and the client `event_id` when one could be read. `serialise` stamps a
fresh `event_id`, applies the dialect's names, and raises `ValueError` for an event the
connection must never receive (a programming error, not a client error).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from realtime_ming.protocol.dialect import (
    GA_CLIENT_SAFE_SERVER_TYPES,
    GA_OPT_IN_SERVER_TYPES,
    PLAYOUT_SERVER_TYPES,
    TIMINGS_EVENT_TYPE,
    Dialect,
    server_type_to_wire,
)
from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import MAX_QUOTE_CHARS, ProtocolError, clip
from realtime_ming.protocol.events import CLIENT_EVENTS, SERVER_EVENTS, ClientEvent, ServerEvent
from realtime_ming.protocol.ids import IdPrefix, new_id
from realtime_ming.protocol.known_keys import check_known_keys
from realtime_ming.protocol.limits import (
    MAX_ID_CHARS,
    CAPPED_UNLESS_MEDIA_TYPES,
    MAX_TOOLS_JSON_BYTES,
    MEDIA_EVENT_TYPES,
    check_json,
    check_tools_size,
    load_json,
    text_problem,
)
from realtime_ming.protocol.media_scan import carries_media, may_carry_media
from realtime_ming.protocol.wire import JsonValue

__all__ = ["LEADING_CHARS", "TRAILING_CHARS", "event_to_wire", "leading_type", "parse", "refuse_by_leading_chars",
           "refuse_by_leading_type", "serialise"]


def _decode(obj: Mapping[str, Any], dialect: Dialect, event_id: str | None) -> ClientEvent:
    if "type" not in obj:
        raise ProtocolError(ErrorCode.INVALID_EVENT, param="type", detail="missing required field 'type'")
    event_type = obj["type"]
    if not isinstance(event_type, str):
        raise ProtocolError(ErrorCode.INVALID_EVENT, param="type", detail="'type' must be a string")
    cls = CLIENT_EVENTS.get(event_type)
    if cls is None:
        raise ProtocolError(ErrorCode.UNKNOWN_EVENT, param="type", event_type=clip(event_type, MAX_QUOTE_CHARS))
    event = cls.from_wire(obj, dialect, event_id)
    check_known_keys(obj, dialect)  # after the decoder, whose errors about a known key are more specific
    return event


def _echoable_event_id(obj: Mapping[str, Any]) -> str | None:
    """The client `event_id` if it can be echoed in an error (a short, clean string), else None."""
    event_id = obj.get("event_id")
    if isinstance(event_id, str) and len(event_id) <= MAX_ID_CHARS and text_problem(event_id) is None:
        return event_id
    return None


def _check_event_id(event_id: object) -> None:
    if event_id is None:
        return
    if not isinstance(event_id, str):
        raise ProtocolError(ErrorCode.INVALID_EVENT, param="event_id", detail="'event_id' must be a string")
    if len(event_id) > MAX_ID_CHARS:
        raise ProtocolError(
            ErrorCode.STRING_ABOVE_MAX_LENGTH, param="event_id", length=len(event_id), max_length=MAX_ID_CHARS
        )


_TOOLS_HOLDER = {"session.update": "session", "response.create": "response"}  # where an event's tools are


def _check_sizes(obj: Mapping[str, Any], num_chars: int, control_max_bytes: int | None) -> None:
    """The size bounds a large frame is refused by right after decoding, before any value of it is checked or
    decoded (the costly part): an event that carries no media (any type but `MEDIA_EVENT_TYPES`, or one of
    `CAPPED_UNLESS_MEDIA_TYPES` without a media string: `media_scan.carries_media`) over `control_max_bytes`
    (`event_frame_too_large`), tools
    over `MAX_TOOLS_JSON_BYTES` (`tools_too_large`, as the tools' decoder says it for a smaller frame)."""
    event_type = obj.get("type")
    if not isinstance(event_type, str):
        event_type = None  # an untyped event is refused as such (after the checks, which name the value)
    if (control_max_bytes is not None and num_chars > control_max_bytes
            and (event_type not in MEDIA_EVENT_TYPES
                 or (event_type in CAPPED_UNLESS_MEDIA_TYPES and not carries_media(obj)))):
        raise _frame_too_large(event_type, num_chars, control_max_bytes)
    key = _TOOLS_HOLDER.get(event_type or "")
    holder = obj.get(key) if key is not None and num_chars > MAX_TOOLS_JSON_BYTES else None
    tools = holder.get("tools") if isinstance(holder, dict) else None
    if isinstance(tools, list):
        check_tools_size(tools, f"{key}.tools")


def _frame_too_large(event_type: str | None, num_bytes: int, control_max_bytes: int) -> ProtocolError:
    shown = "untyped" if event_type is None or text_problem(event_type) else f"'{clip(event_type, MAX_QUOTE_CHARS)}'"
    return ProtocolError(ErrorCode.EVENT_FRAME_TOO_LARGE, param="type", event_type=shown, num_bytes=num_bytes,
                         max_bytes=control_max_bytes, media_types=", ".join(sorted(MEDIA_EVENT_TYPES)))


# A frame that opens with its `type` (what every client library writes), optionally with its `event_id` just before
# or after it: `{"type":"session.update","event_id":"e1",...`. Only unescaped strings; anything else does not match.
_WS = r"[ \t\r\n]*"  # JSON's whitespace
_LEADING_TYPE = re.compile(rf'{_WS}\{{{_WS}(?:"event_id"{_WS}:{_WS}"(?P<id1>[^"\\]*)"{_WS},{_WS})?"type"{_WS}:{_WS}'
                           rf'"(?P<type>[^"\\]*)"{_WS}(?:,{_WS}"event_id"{_WS}:{_WS}"(?P<id2>[^"\\]*)"{_WS})?[,}}]')
LEADING_CHARS = 4 * MAX_ID_CHARS + 256  # how much of the frame's start `_LEADING_TYPE` may look at
# A frame that ends with its `event_id` (`...,"event_id":"e1"}`, as the openai SDK writes session.update): in valid
# JSON the last `}` closes the frame's object, so a key just before it is the event's own.
_TRAILING_EVENT_ID = re.compile(rf',{_WS}"event_id"{_WS}:{_WS}"(?P<id>[^"\\]*)"{_WS}\}}{_WS}\Z')
TRAILING_CHARS = 4 * MAX_ID_CHARS + 256  # how much of the frame's end `_TRAILING_EVENT_ID` may look at


def leading_type(head: str) -> str | None:
    """The `type` a frame opens with (`_LEADING_TYPE`), read from its first characters `head`; None if it does not."""
    match = _LEADING_TYPE.match(head[:LEADING_CHARS])
    return None if match is None else match["type"]


def refuse_by_leading_type(frame: str, control_max_bytes: int, *, media_less: bool = False) -> ProtocolError | None:
    """`event_frame_too_large` for a frame over `control_max_bytes` whose leading `type` is an event that carries
    no media, read from the frame's first characters without decoding the rest (what `parse` answers after
    decoding it, at no cost: a session.update with megabytes of tools is refused in microseconds). None when the
    frame is within the cap, does not open with its type (then `parse` decides), or its type may carry media.
    A later duplicate `type` key is not looked for: a frame that names two types is refused by its first.
    `media_less`: as `refuse_by_leading_chars` has it."""
    return refuse_by_leading_chars(frame[:LEADING_CHARS], len(frame), control_max_bytes,
                                   tail=frame[-TRAILING_CHARS:], media_less=media_less)


def refuse_by_leading_chars(head: str, num_chars: int, control_max_bytes: int, *, tail: str = "",
                            media_less: bool = False) -> ProtocolError | None:
    """`refuse_by_leading_type` of a frame known only by its first characters `head` (its first `LEADING_CHARS`,
    or all of it when shorter), its last ones `tail` (where an `event_id` may be) and its length in characters
    `num_chars`: a frame still arriving (server/big_frames.py) is judged with the characters counted so far, and
    answered with its final count. `media_less`: the frame is known to carry no media (`media_scan`), so an event
    of `CAPPED_UNLESS_MEDIA_TYPES` is refused too. The event_id echoed is the frame's last one (as decoding has
    it): trailing, else the leading one."""
    if num_chars <= control_max_bytes:
        return None
    match = _LEADING_TYPE.match(head[:LEADING_CHARS])
    if match is None or (match["type"] in MEDIA_EVENT_TYPES
                         and not (media_less and match["type"] in CAPPED_UNLESS_MEDIA_TYPES)):
        return None
    trailing = _TRAILING_EVENT_ID.search(tail[-TRAILING_CHARS:]) if tail else None
    event_id = trailing["id"] if trailing is not None else match["id2"] if match["id2"] is not None else match["id1"]
    error = _frame_too_large(match["type"], num_chars, control_max_bytes)
    if event_id is not None and len(event_id) <= MAX_ID_CHARS and text_problem(event_id) is None:
        error = error.with_event_id(event_id)
    return error


def parse(frame: str | bytes, dialect: Dialect, *, control_max_bytes: int | None = None) -> ClientEvent | ProtocolError:
    """Decode one WebSocket message into a typed client event, or the error to send back.

    Every value of the frame is checked first (`limits.check_json`: nesting, numbers, text), so
    no decoder below ever sees a lone surrogate, a control character or a non-finite number.
    Size bounds come before that (`_check_sizes`): with `control_max_bytes`, a larger frame whose event carries
    no media (not one of `limits.MEDIA_EVENT_TYPES`, or a `response.create` without a media string:
    `limits.CAPPED_UNLESS_MEDIA_TYPES`) is refused with `event_frame_too_large` (param `type`), and tools over
    `MAX_TOOLS_JSON_BYTES` with `tools_too_large`. A response.create that opens with its type and whose text shows
    no media (`media_scan.may_carry_media`) is refused so before it is decoded.
    """
    if not isinstance(frame, str):
        return ProtocolError(ErrorCode.BINARY_FRAME_UNSUPPORTED)
    if (control_max_bytes is not None and len(frame) > control_max_bytes
            and leading_type(frame) in CAPPED_UNLESS_MEDIA_TYPES and not may_carry_media(frame)):
        # a response.create without media over the cap: refused undecoded (what `_check_sizes` says after decoding)
        return refuse_by_leading_type(frame, control_max_bytes, media_less=True)
    try:
        obj = load_json(frame)
    except ProtocolError as error:
        return error
    event_id = _echoable_event_id(obj) if isinstance(obj, dict) else None
    try:
        if isinstance(obj, dict):
            _check_sizes(obj, len(frame), control_max_bytes)
        check_json(obj)
        if not isinstance(obj, dict):
            raise ProtocolError(ErrorCode.INVALID_EVENT, detail="the frame must be a JSON object")
        _check_event_id(obj.get("event_id"))
        return _decode(obj, dialect, event_id)
    except ProtocolError as error:
        return error.with_event_id(event_id)


def _check_allowed(event: ServerEvent, dialect: Dialect, timing_events: bool, playout: bool) -> None:
    if SERVER_EVENTS.get(event.type) is not type(event):
        raise ValueError(f"{type(event).__name__} is not a registered server event")
    if event.type == TIMINGS_EVENT_TYPE:
        if not timing_events:
            raise ValueError(f"{TIMINGS_EVENT_TYPE} requires the session's timing_events opt-in")
    elif event.type in PLAYOUT_SERVER_TYPES:
        if not playout or dialect is not Dialect.GA:
            raise ValueError(f"{event.type} is sent only by a transport that owns the playout (GA WebRTC)")
    elif dialect is Dialect.GA and event.type not in GA_CLIENT_SAFE_SERVER_TYPES | GA_OPT_IN_SERVER_TYPES:
        raise ValueError(f"{event.type} must not be sent to a GA connection")


def event_to_wire(
    event: ServerEvent, dialect: Dialect, *, timing_events: bool = False, playout: bool = False
) -> dict[str, JsonValue] | None:
    """The JSON object for `event` with a fresh `event_id`; `None` when `dialect` drops it
    (beta has no `conversation.item.done`). Raises `ValueError` for a forbidden event: `playout` allows
    `output_audio_buffer.*` (a transport that plays the audio out itself, `PLAYOUT_SERVER_TYPES`)."""
    _check_allowed(event, dialect, timing_events, playout)
    wire_type = server_type_to_wire(event.type, dialect)
    if wire_type is None:
        return None
    return {"type": wire_type, "event_id": new_id(IdPrefix.EVENT), **event.wire_body(dialect)}


def serialise(event: ServerEvent, dialect: Dialect, *, timing_events: bool = False,
              playout: bool = False) -> str | None:
    """`event_to_wire` as a compact JSON text frame; `None` means "send nothing".

    Raises `ValueError` (never a half-sent frame later) when the text cannot be UTF-8 encoded.
    """
    wire = event_to_wire(event, dialect, timing_events=timing_events, playout=playout)
    if wire is None:
        return None
    text = json.dumps(wire, ensure_ascii=False, separators=(",", ":"))
    if not text.isascii():
        text.encode("utf-8")  # UnicodeEncodeError (a ValueError) on a lone surrogate
    return text
