"""Server frames -> typed server events: the inverse of `codec.serialise`, for clients (the SDK, tests).

Decoding is driven by the event classes themselves, the way `ServerEvent.wire_body` encodes them: each
dataclass field is read by its annotation (`wire.from_json`, the inverse of `wire.to_json`), and a value type that writes a custom shape
(`Response`, `Usage`, `SessionConfig`) reads it back with the `from_wire` classmethod that sits next to
its `to_wire`. Beta names map back through `dialect.server_type_to_wire`. Server values are read as the
server writes them, not as a client may send them (an assistant message with no content yet, a
temperature of 0), so this is not the client-event validator of `codec.parse`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from realtime_ming.protocol.dialect import Dialect, server_type_to_wire
from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import MAX_QUOTE_CHARS, ProtocolError, clip
from realtime_ming.protocol.events import SERVER_EVENTS, ServerEvent
from realtime_ming.protocol.wire import expect_object, expect_str

__all__ = ["decode_server_event", "server_event_class"]

# Wire name in each dialect -> GA event class (beta renames a few; see `dialect`).
_CLASSES_BY_WIRE: Final = {
    dialect: {
        wire: cls
        for ga_type, cls in SERVER_EVENTS.items()
        if (wire := server_type_to_wire(ga_type, dialect)) is not None
    }
    for dialect in Dialect
}


def server_event_class(wire_type: str, dialect: Dialect) -> type[ServerEvent] | None:
    """The GA event class of a server frame's `type` in `dialect`, or `None` if unknown."""
    return _CLASSES_BY_WIRE[dialect].get(wire_type)


def decode_server_event(frame: str | bytes | Mapping[str, Any], dialect: Dialect = Dialect.GA) -> ServerEvent:
    """Read one server frame (JSON text or an already-parsed object) of `dialect` into its registered GA
    event class (`response.audio.delta` -> `ResponseOutputAudioDelta`). Raises `ProtocolError`
    (`invalid_json`, `invalid_event`, `unknown_event`, `invalid_value`) for anything else."""
    if isinstance(frame, Mapping):
        obj: Any = frame
    else:
        try:
            obj = json.loads(frame)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.INVALID_JSON, detail=str(exc)) from exc
    obj = expect_object(obj, "")
    wire_type = expect_str(obj.get("type"), "type")
    cls = server_event_class(wire_type, dialect)
    if cls is None:
        raise ProtocolError(ErrorCode.UNKNOWN_EVENT, param="type", event_type=clip(wire_type, MAX_QUOTE_CHARS))
    return cls.from_wire(obj, dialect)
