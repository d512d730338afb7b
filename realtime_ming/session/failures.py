"""One log line per unexpected failure while serving a request (traceback only at DEBUG).

A failure in a handler must cost the client one `server_error` event, not the session, and the
log one line naming the session, the request and the exception; a frame an attacker can repeat
must not multiply into pages of traceback.
"""

from __future__ import annotations

import logging

__all__ = ["describe", "log_failure"]

_MAX_MESSAGE_CHARS = 300


def describe(exc: BaseException) -> str:
    """`Class: message` on one line, cut to a few hundred characters."""
    message = " ".join(str(exc).split())
    if len(message) > _MAX_MESSAGE_CHARS:
        message = message[: _MAX_MESSAGE_CHARS - 1] + "\u2026"
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


def log_failure(
    logger: logging.Logger, session_id: str, request: str, request_id: str | None, exc: BaseException
) -> None:
    """Log `exc`, raised while handling `request` (an event type) of `session_id`, as one line.

    `request_id` is the client's `event_id` or the engine turn id (`None`: the client sent none).
    """
    logger.error(
        "session %s: %s (id %s) failed: %s", session_id, request, request_id or "-", describe(exc),
        exc_info=exc if logger.isEnabledFor(logging.DEBUG) else None,
    )
