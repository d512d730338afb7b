"""What a `Session` asks its driver to do: send a server event, command the engine, record metrics.

The session never performs I/O; each handler returns a list of these values in the order they
must happen (e.g. `CancelTurn` before the cancelled `response.done` is sent).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..engine.api import TurnRequest
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.events import ServerEvent
from ..protocol.mcp import McpTool
from ..protocol.responses import ResponseStatus
from ..protocol.server_events import Error

__all__ = [
    "Action",
    "CallMcpTool",
    "CancelTurn",
    "CloseConversation",
    "ConfirmTurn",
    "DiscardTurn",
    "ListMcpTools",
    "ResponseFinished",
    "Send",
    "SubmitTurn",
    "error_reply",
]


@dataclass(frozen=True, slots=True)
class Send:
    """Send `event` to the client (the driver serialises it for the connection's dialect)."""

    event: ServerEvent


@dataclass(frozen=True, slots=True)
class SubmitTurn:
    """Start `request` in the engine (speculative requests hold their output until confirmed)."""

    request: TurnRequest


@dataclass(frozen=True, slots=True)
class ConfirmTurn:
    """Release a speculative turn's output: it is now the active response."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class DiscardTurn:
    """Drop a speculative turn without a trace (the user kept talking)."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class CancelTurn:
    """Stop a running turn; the session has already ended its response on the wire."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class CloseConversation:
    """Free the engine's cached KV slot of a conversation (session end)."""

    conversation_id: str


@dataclass(frozen=True, slots=True)
class ListMcpTools:
    """List the tools of `server` (`mcp_list_tools` item `item_id`); the outcome goes to `Session.on_mcp_listed`."""

    item_id: str
    server: McpTool


@dataclass(frozen=True, slots=True)
class CallMcpTool:
    """Call tool `name` of `server` with the model's JSON `arguments` (`mcp_call` item `item_id`); the outcome
    goes to `Session.on_mcp_called`."""

    item_id: str
    server: McpTool
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ResponseFinished:
    """A response ended (for metrics). Seconds; `ttfa_s` is None when no audio was sent.

    `ttfa_s` runs from the end of user input (speech stop, or `response.create`) to the first
    audio delta; `stage_s` maps engine stages to seconds after the turn's submission.
    """

    response_id: str
    status: ResponseStatus
    ttfa_s: float | None
    was_speculative: bool
    stage_s: Mapping[str, float] = field(default_factory=dict)


Action = (Send | SubmitTurn | ConfirmTurn | DiscardTurn | CancelTurn | CloseConversation | ResponseFinished
          | ListMcpTools | CallMcpTool)


def error_reply(code: ErrorCode, event_id: str | None, *, param: str | None = None, **values: object) -> list[Action]:
    """The `error` event that refuses client event `event_id` (the session goes on)."""
    return [Send(Error.from_protocol_error(ProtocolError(code, param=param, event_id=event_id, **values)))]
