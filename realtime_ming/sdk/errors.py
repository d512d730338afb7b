"""The SDK's exception tree; every error the SDK raises on purpose derives from `RealtimeError`.

    RealtimeError
    ├── AuthenticationError   the server refused the API key or Origin (HTTP 401 / 403)
    ├── ConnectError          no session could be opened (refused, timeout, 5xx, server full)
    ├── ConnectionClosed      the session ended; no more events will arrive
    ├── ProtocolViolation     the server sent a frame the SDK cannot read as a server event
    └── ServerError           an `error` event, raised only when `raise_on_error` is on

Invalid arguments to SDK calls raise `ValueError` / `TypeError` as usual.
"""

from __future__ import annotations

from ..protocol.responses import ErrorDetail
from ..protocol.server_events import Error

__all__ = [
    "AuthenticationError",
    "ConnectError",
    "ConnectionClosed",
    "ProtocolViolation",
    "RealtimeError",
    "ServerError",
]


class RealtimeError(Exception):
    """Base class of every SDK error."""


class AuthenticationError(RealtimeError):
    """The upgrade was refused with HTTP `status` 401 (bad or missing key) or 403 (Origin)."""

    def __init__(self, status: int, body: str = "") -> None:
        super().__init__(f"HTTP {status}: {body.strip() or 'authentication failed'}")
        self.status = status
        self.body = body


class ConnectError(RealtimeError):
    """Opening a session failed after every attempt the reconnect policy allows."""


class ConnectionClosed(RealtimeError):
    """The session is over: `code` is the WebSocket close code (None: no close frame, or local)."""

    def __init__(self, code: int | None = None, reason: str = "") -> None:
        super().__init__(f"connection closed ({code}{': ' + reason if reason else ''})")
        self.code = code
        self.reason = reason


class ProtocolViolation(RealtimeError):
    """A server frame that is not valid JSON, has an unknown `type` or a malformed field."""

    def __init__(self, message: str, frame: str | bytes | None = None) -> None:
        super().__init__(message)
        self.frame = frame


class ServerError(RealtimeError):
    """An `error` event surfaced as an exception (`raise_on_error=True`).

    `code` is the stable `ErrorCode` value (e.g. `response_cancel_not_active`), `event_id` the
    client event it answers (when the client gave one), `event` the typed `Error` itself.
    """

    def __init__(self, event: Error) -> None:
        detail: ErrorDetail = event.error
        super().__init__(f"{detail.code}: {detail.message}")
        self.event = event
        self.code = detail.code
        self.error_type = detail.type
        self.param = detail.param
        self.event_id = detail.event_id
