"""Remote MCP tools in a session's responses: the outcomes the runner hands back (a listing, a call) and the
client's approvals (`mcp_calls.McpServers` holds the state; docs/protocol.md §4.2). A response that waits
for its calls and the follow-up response that answers from them are `lifecycle`'s (`finish_or_wait`,
`follow_up`). Plain functions of the session, like `lifecycle`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol.mcp import McpApprovalResponseItem, McpCallError, McpToolInfo
from ..protocol.server_events import ConversationItemDone
from .actions import Action, Send
from .lifecycle import finish_or_wait, follow_up

if TYPE_CHECKING:
    from .session import Session

__all__ = ["on_answer", "on_called", "on_listed"]


def on_listed(session: Session, item_id: str, outcome: tuple[McpToolInfo, ...] | McpCallError) -> list[Action]:
    """A listing ended (the runner's task)."""
    return session.mcp.on_listed(item_id, outcome)


def on_called(session: Session, item_id: str, outcome: str | McpCallError, now: float) -> list[Action]:
    """A call ended (the runner's task): its item settles; a response that waited for it ends. An approved call
    (outside any response) is answered by a follow-up response: now, or once the response running meanwhile
    completes."""
    item, actions = session.mcp.on_called(item_id, outcome)
    if item is None:
        return actions
    owner = next((r for r in (session._response, *session._oob.values())
                  if r is not None and item_id in {i.id for i in r.calls.items}), None)
    if owner is None:
        if item.id in session.conversation:
            actions.append(Send(ConversationItemDone(item=item)))
        if item.approval_request_id is not None:
            if session._response is None:
                actions += follow_up(session, now, None, 0)
            else:
                session._response.owes_answer = True
        return actions
    actions += [Send(e) for e in owner.calls.settle(item)]
    if owner.deferred is not None and not owner.calls.pending:
        status, details = owner.deferred
        owner.deferred = None
        actions += finish_or_wait(session, owner, status, now, **details)
    return actions


def on_answer(session: Session, answer: McpApprovalResponseItem) -> list[Action]:
    """The client answered an approval request (the item is already in the conversation)."""
    return session.mcp.on_answer(answer)
