"""The only ways in and out: `parse` (text frame -> client event) and `serialise` (server event -> text).

`parse` never raises on client input: every bad frame becomes a `ProtocolError` with a stable
code, the `param` path and the client `event_id` when one could be read. `serialise` stamps a
fresh `event_id`, applies the dialect's names, and raises `ValueError` for an event the
connection must never receive (a programming error, not a client error).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NoReturn

from realtime_ming.protocol.dialect import (
    GA_CLIENT_SAFE_SERVER_TYPES,
    TIMINGS_EVENT_TYPE,
    Dialect,
    server_type_to_wire,
)
from realtime_ming.protocol.errors import ErrorCode, ProtocolError
from realtime_ming.protocol.events import CLIENT_EVENTS, SERVER_EVENTS, ClientEvent, ServerEvent
from realtime_ming.protocol.ids import IdPrefix, new_id
from realtime_ming.protocol.wire import JsonValue

__all__ = ["event_to_wire", "parse", "serialise"]


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _load(frame: str) -> Any:
    try:
        return json.loads(frame, parse_constant=_reject_constant)
    except RecursionError:
        raise ProtocolError(ErrorCode.INVALID_JSON, detail="nesting is too deep") from None
    except ValueError as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, detail=str(exc)) from None


def _decode(obj: Mapping[str, Any], dialect: Dialect, event_id: str | None) -> ClientEvent:
    if "type" not in obj:
        raise ProtocolError(ErrorCode.INVALID_EVENT, param="type", detail="missing required field 'type'")
    event_type = obj["type"]
    if not isinstance(event_type, str):
        raise ProtocolError(ErrorCode.INVALID_EVENT, param="type", detail="'type' must be a string")
    cls = CLIENT_EVENTS.get(event_type)
    if cls is None:
        raise ProtocolError(ErrorCode.UNKNOWN_EVENT, param="type", event_type=event_type)
    return cls.from_wire(obj, dialect, event_id)


def parse(frame: str | bytes, dialect: Dialect) -> ClientEvent | ProtocolError:
    """Decode one WebSocket message into a typed client event, or the error to send back."""
    if not isinstance(frame, str):
        return ProtocolError(ErrorCode.BINARY_FRAME_UNSUPPORTED)
    try:
        obj = _load(frame)
    except ProtocolError as error:
        return error
    if not isinstance(obj, dict):
        return ProtocolError(ErrorCode.INVALID_EVENT, detail="the frame must be a JSON object")
    event_id = obj.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        return ProtocolError(ErrorCode.INVALID_EVENT, param="event_id", detail="'event_id' must be a string")
    try:
        return _decode(obj, dialect, event_id)
    except ProtocolError as error:
        return error.with_event_id(event_id)


def _check_allowed(event: ServerEvent, dialect: Dialect, timing_events: bool) -> None:
    if SERVER_EVENTS.get(event.type) is not type(event):
        raise ValueError(f"{type(event).__name__} is not a registered server event")
    if event.type == TIMINGS_EVENT_TYPE:
        if not timing_events:
            raise ValueError(f"{TIMINGS_EVENT_TYPE} requires the session's timing_events opt-in")
    elif dialect is Dialect.GA and event.type not in GA_CLIENT_SAFE_SERVER_TYPES:
        raise ValueError(f"{event.type} must not be sent to a GA connection")


def event_to_wire(
    event: ServerEvent, dialect: Dialect, *, timing_events: bool = False
) -> dict[str, JsonValue] | None:
    """The JSON object for `event` with a fresh `event_id`; `None` when `dialect` drops it
    (beta has no `conversation.item.done`). Raises `ValueError` for a forbidden event."""
    _check_allowed(event, dialect, timing_events)
    wire_type = server_type_to_wire(event.type, dialect)
    if wire_type is None:
        return None
    return {"type": wire_type, "event_id": new_id(IdPrefix.EVENT), **event.wire_body(dialect)}


def serialise(event: ServerEvent, dialect: Dialect, *, timing_events: bool = False) -> str | None:
    """`event_to_wire` as a compact JSON text frame; `None` means "send nothing"."""
    wire = event_to_wire(event, dialect, timing_events=timing_events)
    if wire is None:
        return None
    return json.dumps(wire, ensure_ascii=False, separators=(",", ":"))
