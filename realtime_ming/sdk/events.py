"""Server frames -> typed `protocol` server events, as the SDK raises them.

The decoding itself is `protocol.decode.decode_server_event` (the one set of wire types the server
serialises); this module only turns its `ProtocolError` into the SDK's `ProtocolViolation`, keeping the frame.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..protocol.decode import decode_server_event
from ..protocol.dialect import Dialect
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.events import ServerEvent
from .errors import ProtocolViolation

__all__ = ["parse_server_event"]


def parse_server_event(frame: str | bytes | Mapping[str, Any], dialect: Dialect = Dialect.GA) -> ServerEvent:
    """Read one server frame (JSON text or an already-decoded object) of `dialect`.

    Returns the registered GA event class for the frame's type, beta names included
    (`response.audio.delta` → `ResponseOutputAudioDelta`). Raises `ProtocolViolation` for
    invalid JSON, a missing or unknown `type`, or a field of the wrong shape.
    """
    try:
        return decode_server_event(frame, dialect)
    except ProtocolError as exc:
        raw = None if isinstance(frame, Mapping) else frame
        raise ProtocolViolation(_describe(exc, frame, dialect), raw) from exc


def _describe(error: ProtocolError, frame: str | bytes | Mapping[str, Any], dialect: Dialect) -> str:
    if error.code is ErrorCode.INVALID_JSON:
        return f"server frame is not JSON: {error}"
    obj = frame if isinstance(frame, Mapping) else json.loads(frame)
    event_type = obj.get("type") if isinstance(obj, Mapping) else None
    if not isinstance(event_type, str):
        return "server frame is not an object with a string 'type'"
    if error.code is ErrorCode.UNKNOWN_EVENT:
        return f"unknown server event type {event_type!r} ({dialect.value})"
    return f"malformed {event_type} event: {error}"
