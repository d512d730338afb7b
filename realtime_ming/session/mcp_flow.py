"""Remote MCP tools in a session's responses: a call's outcome handed back by the runner settles its item and
the response waiting for it (`mcp_calls.McpServers` holds the calls' state; docs/protocol.md §4.2). A response
that waits for its calls and the follow-up response that answers from them are `lifecycle.Responses`'
(`finish_or_wait`, `follow_up`)."""

from __future__ import annotations

from ..protocol.mcp import McpCallError
from ..protocol.server_events import ConversationItemDone
from .actions import Action, Send
from .conversation import Conversation
from .lifecycle import Responses
from .mcp_calls import McpServers

__all__ = ["on_called"]


def on_called(responses: Responses, mcp: McpServers, conversation: Conversation, item_id: str,
              outcome: str | McpCallError, now: float) -> list[Action]:
    """A call ended (the runner's task): its item settles; a response that waited for it ends. An approved call
    (outside any response) is answered by a follow-up response: now, or once the response running meanwhile
    completes."""
    item, actions = mcp.on_called(item_id, outcome)
    if item is None:
        return actions
    owner = next((r for r in responses.running() if item_id in {i.id for i in r.calls.items}), None)
    if owner is None:
        if item.id in conversation:
            actions.append(Send(ConversationItemDone(item=item)))
        if item.approval_request_id is not None:
            active = responses.active
            if active is None:
                actions += responses.follow_up(now, None, 0)
            else:
                active.owes_answer = True
        return actions
    actions += [Send(e) for e in owner.calls.settle(item)]
    if owner.deferred is not None and not owner.calls.pending:
        status, details = owner.deferred
        owner.deferred = None
        actions += responses.finish_or_wait(owner, status, now, **details)
    return actions
