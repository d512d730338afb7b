"""The server's drain deadline: every response still running ends with a `response.done` before the close.

`end_responses` is what a session does when the server stops waiting for its responses (`server.limits.
drain_timeout_s` passed, or a second signal): each running response, of the default conversation or out of band,
has its engine turn cancelled and ends `cancelled` with the error `server_shutting_down` in its `status_details`
(OpenAI's `reason` values name only a VAD turn or the client's cancel), its pending `.done` events first, as any
cancelled response does. Before that the session's paced output is released (`Playout.release`): a reply whose
engine turn has finished sends the rest of its audio at once and completes. The connection then closes (1001)
after these events.
"""

from __future__ import annotations

from ..protocol.error_codes import ErrorCode
from ..protocol.responses import ErrorDetail, ResponseStatus
from .actions import Action, CancelTurn
from .lifecycle import Responses

__all__ = ["end_responses"]


def end_responses(responses: Responses, now: float) -> list[Action]:
    """Cancel every running response of a session for the server's shutdown (its events, then the engine's stop)."""
    actions: list[Action] = []
    for response in responses.running():
        code = ErrorCode.SERVER_SHUTTING_DOWN
        error = ErrorDetail(type=code.error_type.value, code=code.value,
                            message=f"The server is shutting down: response '{response.id}' was cut off at its "
                                    "drain deadline. Reconnect and retry.")
        actions.append(CancelTurn(response.id))
        actions += responses.finish(ResponseStatus.CANCELLED, now, response=response, error=error)
    return actions
