"""Remote MCP tools in a session's responses: the calls a response starts, a response that waits for them, the
follow-up response that answers from their results, and the client's approvals (`mcp_calls.McpServers` holds
the state; docs/protocol.md §4.2). Plain functions of the session, like `lifecycle`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..protocol import client_events as ce
from ..protocol.mcp import McpApprovalResponseItem, McpCallError, McpToolInfo
from ..protocol.responses import ResponseStatus
from ..protocol.server_events import ConversationItemDone
from ..protocol.values import ToolChoiceMode
from .actions import Action, Send
from .response import ActiveResponse

if TYPE_CHECKING:
    from .session import Session

__all__ = ["MAX_FOLLOW_UPS", "finish_or_wait", "on_answer", "on_called", "on_listed", "take_calls"]

# Follow-up responses in a row that may call MCP tools again: past it, a response's calls still run but the
# server creates no further response (a model that calls tools forever is stopped).
MAX_FOLLOW_UPS = 8


def take_calls(session: Session, response: ActiveResponse) -> list[Action]:
    """Run the MCP calls `response` just started and note the approvals it asks for."""
    actions: list[Action] = []
    calls = response.calls
    for target, item, index in calls.started:
        actions += session.mcp.start_call(target.server, item, index)
    for target, request in calls.approvals:
        session.mcp.await_approval(target.server, request)
    calls.started.clear()
    calls.approvals.clear()
    return actions


def finish_or_wait(session: Session, response: ActiveResponse, status: ResponseStatus, now: float,
                   **details) -> list[Action]:
    """The engine turn of `response` ended: finish it now, or once the MCP calls it started have settled."""
    from .lifecycle import finish_response

    if response.calls.pending and status is ResponseStatus.COMPLETED:
        response.deferred = (status, details)
        return []
    had_calls = any(getattr(i, "type", "") == "mcp_call" for i in response.calls.items)
    actions = finish_response(session, status, now, response=response, **details)
    if had_calls and status is ResponseStatus.COMPLETED:
        actions += _follow_up(session, response, now)
    return actions


def _follow_up(session: Session, after: ActiveResponse, now: float) -> list[Action]:
    """The model answers from the MCP results: a response in the default conversation, with the parameters of
    the one that called (its forced tool choice relaxed to `auto`, else it would call again)."""
    from .lifecycle import start_response

    if (after.spec.conversation_id is None or session._response is not None
            or after.follow_ups >= MAX_FOLLOW_UPS):
        return []
    params = after.params if isinstance(after.params, ce.ResponseParams) else ce.ResponseParams()
    params = replace(params, tool_choice=ToolChoiceMode.AUTO, input=None)
    actions = start_response(session, now, params=params)
    if session._response is not None:
        session._response.follow_ups = after.follow_ups + 1
    return actions


def on_listed(session: Session, item_id: str, outcome: tuple[McpToolInfo, ...] | McpCallError) -> list[Action]:
    """A listing ended (the runner's task)."""
    return session.mcp.on_listed(item_id, outcome)


def on_called(session: Session, item_id: str, outcome: str | McpCallError, now: float) -> list[Action]:
    """A call ended (the runner's task): its item settles; a response that waited for it ends; an approved call
    (outside any response) is answered by a follow-up response."""
    item, actions = session.mcp.on_called(item_id, outcome)
    if item is None:
        return actions
    owner = next((r for r in (session._response, *session._oob.values())
                  if r is not None and item_id in {i.id for i in r.calls.items}), None)
    if owner is None:
        if item.id in session.conversation:
            actions.append(Send(ConversationItemDone(item=item)))
        if item.approval_request_id is not None and session._response is None:
            actions += _follow_up(session, _Outside(session.conversation_id), now)
        return actions
    actions += [Send(e) for e in owner.calls.settle(item)]
    if owner.deferred is not None and not owner.calls.pending:
        status, details = owner.deferred
        owner.deferred = None
        actions += finish_or_wait(session, owner, status, now, **details)
    return actions


class _Outside:
    """What `_follow_up` reads of the response before it, for a call that ran outside any response."""

    follow_ups = 0
    params = None

    def __init__(self, conversation_id: str) -> None:
        self.spec = type("Spec", (), {"conversation_id": conversation_id})()


def on_answer(session: Session, answer: McpApprovalResponseItem) -> list[Action]:
    """The client answered an approval request (the item is already in the conversation)."""
    return session.mcp.on_answer(answer)
