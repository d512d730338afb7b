"""The protocol exception of the Realtime event layer: `ProtocolError` carries one code (`protocol/error_codes.py`)
plus the `param` path and the client `event_id` to echo; every client value rendered into it is clipped.
"""

from __future__ import annotations

from realtime_ming.protocol.error_codes import ErrorCode

__all__ = ["MAX_ECHO_CHARS", "MAX_QUOTE_CHARS", "ProtocolError", "clip"]

# Every text value and param path rendered into an error is cut to MAX_ECHO_CHARS, so an error
# event stays small whatever the client sent; client text quoted inside a `detail` is cut
# shorter (MAX_QUOTE_CHARS) where it is quoted.
MAX_ECHO_CHARS = 1024
MAX_QUOTE_CHARS = 64


def clip(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """`text` cut to `limit` characters (with a trailing `…` when cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


class ProtocolError(Exception):
    """A client-visible error: `code`, rendered `message`, `param` path, echoed client `event_id`.

    Raised inside the protocol layer and by `apply_update`; `codec.parse` returns it instead of
    raising. `server_events.Error.from_protocol_error` turns it into the wire `error` event.
    """

    code: ErrorCode
    message: str
    param: str | None
    event_id: str | None

    def __init__(
        self,
        code: ErrorCode,
        *,
        param: str | None = None,
        event_id: str | None = None,
        **values: object,
    ) -> None:
        if param is not None:
            param = clip(param)
        values = {key: clip(value) if isinstance(value, str) else value for key, value in values.items()}
        message = code.render(param=param, **values)
        super().__init__(message)
        self.code, self.message, self.param, self.event_id = code, message, param, event_id

    def with_event_id(self, event_id: str | None) -> ProtocolError:
        """Return a copy that echoes `event_id` (the offending client event)."""
        clone = ProtocolError.__new__(ProtocolError)
        Exception.__init__(clone, self.message)
        clone.code, clone.message, clone.param, clone.event_id = (
            self.code,
            self.message,
            self.param,
            event_id,
        )
        return clone

    def __reduce__(self):
        """Pickled as its fields (a frame parsed in another process sends its error back)."""
        return _rebuild_error, (self.code, self.message, self.param, self.event_id)

    def __repr__(self) -> str:
        return f"ProtocolError({self.code.value!r}, param={self.param!r}, event_id={self.event_id!r})"


def _rebuild_error(code: ErrorCode, message: str, param: str | None, event_id: str | None) -> ProtocolError:
    error = ProtocolError.__new__(ProtocolError)
    Exception.__init__(error, message)
    error.code, error.message, error.param, error.event_id = code, message, param, event_id
    return error
