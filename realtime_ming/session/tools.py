"""Function calling in a session: tools and `tool_choice` into the engine request, and the model's calls
(engine `ToolCall*` events) into GA function-call items and events.

Tools are rendered as the chat-completions shape `{"type": "function", "function": {name, description,
parameters}}` that Ming's chat template is fed with. `tool_choice`: `auto` renders the tools and lets the
model choose; `none` renders no tools (a call the model writes anyway is cut out of the spoken text and dropped, as
with no tools at all: `engine/tool_calls.py`); `required` forces the reply to start with
`<tool_call>\\n{"name": "` + one of the offered names + `", "arguments": ` (constrained decoding in the thinker:
the model picks the name, its logits masked to the offered names' tokens) and a named function forces its own
name, so a call of an offered function is certain, not hoped for.

Outcomes of a malformed call (not JSON, arguments not an object, an unknown function, no `</tool_call>`):
the call is never spoken nor run; a started `function_call` item ends `incomplete` (it stays in the
conversation but the model never sees it), and the response ends `failed` with
`status_details.error.code = "invalid_tool_call"` naming why — or `incomplete` / `max_output_tokens` when
the call was cut by the token limit. The session and the conversation go on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

from ..engine.api import ToolCallArguments, ToolCallEnd, ToolCallStart
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.events import ServerEvent
from ..protocol.ids import IdPrefix, new_id
from ..protocol.items import FunctionCallItem, ItemStatus
from ..protocol.mcp import McpApprovalRequestItem, McpCallError, McpCallItem, McpTool
from ..protocol.mcp_events import ResponseMcpCallArgumentsDelta, ResponseMcpCallArgumentsDone
from ..protocol.responses import ErrorDetail
from ..protocol.server_events import (
    ConversationItemAdded,
    ConversationItemDone,
    ResponseFunctionCallArgumentsDelta,
    ResponseFunctionCallArgumentsDone,
    ResponseOutputItemAdded,
    ResponseOutputItemDone,
)
from ..protocol.values import FunctionChoice, Tool, ToolChoice, ToolChoiceMode
from .conversation import Conversation, StoredItem
from .mcp import function_tools
from .mcp_calls import McpTarget

__all__ = ["ResponseCalls", "check_tool_choice", "engine_tools", "forces_call", "response_tools"]

_CALL_START = '<tool_call>\n{"name": "'


def response_tools(config, params) -> tuple[tuple[Tool, ...], ToolChoice]:
    """The tools and tool choice of a response: its `response.create` values, else the session's."""
    tools = params.tools if params is not None and params.tools is not None else config.tools
    choice = params.tool_choice if params is not None and params.tool_choice is not None else config.tool_choice
    return tools, choice


def forces_call(tools: tuple[Tool, ...], choice: ToolChoice) -> bool:
    """Whether the reply is forced to start with a call (`required` / a named function, with tools)."""
    return bool(function_tools(tools)) and (choice is ToolChoiceMode.REQUIRED or isinstance(choice, FunctionChoice))


def engine_tools(tools: tuple[Tool, ...],
                 choice: ToolChoice) -> tuple[tuple[dict, ...], str, tuple[str, ...]]:
    """(tools as the template renders them, the forced reply prefix, the forced choices after it) for a response."""
    tools = function_tools(tools)
    if choice is ToolChoiceMode.NONE or not tools:
        return (), "", ()
    rendered = tuple(
        {"type": "function",
         "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)}}
        for t in tools
    )
    if choice is ToolChoiceMode.REQUIRED:
        return rendered, _CALL_START, tuple(_call_head(t.name) for t in tools)
    if isinstance(choice, FunctionChoice):
        return rendered, _CALL_START, (_call_head(choice.name),)
    return rendered, "", ()


def _call_head(name: str) -> str:
    """A call's text after `_CALL_START` up to its arguments: the name as JSON writes it inside the string."""
    return json.dumps(name, ensure_ascii=False)[1:-1] + '", "arguments": '


def check_tool_choice(tools: tuple[Tool, ...], choice: ToolChoice, param: str) -> None:
    """A named `tool_choice` must name one of the tools; `required` needs at least one tool."""
    names = [t.name for t in function_tools(tools)]
    if isinstance(choice, FunctionChoice) and choice.name not in names:
        raise ProtocolError(ErrorCode.TOOL_CHOICE_UNKNOWN_FUNCTION, param=param, name=choice.name,
                            names=", ".join(names) or "none")
    if choice is ToolChoiceMode.REQUIRED and not names and not any(isinstance(t, McpTool) for t in tools):
        raise ProtocolError(ErrorCode.TOOL_CHOICE_UNKNOWN_FUNCTION, param=param, name="(any)", names="none")


CallItem = FunctionCallItem | McpCallItem | McpApprovalRequestItem


class ResponseCalls:
    """The call items of one response; each takes the output index `next_index()` gives when it starts (after the
    message item, or first when the response forces a call). A call naming a listed MCP tool (`mcp_target`)
    becomes an `mcp_call` item (or, needing approval, an `mcp_approval_request` once its arguments are
    written); `started` and `approvals` hold what the session must run or wait for, `pending` the calls
    running."""

    def __init__(self, response_id: str, conversation: Conversation | None, next_index: Callable[[], int],
                 mcp_target: Callable[[str], McpTarget | None] = lambda _name: None) -> None:
        self.response_id = response_id
        self._conversation = conversation
        self._next_index = next_index
        self._mcp_target = mcp_target
        self._indexes: dict[str, int] = {}  # item id -> output index
        self.items: list[CallItem] = []
        self._open: FunctionCallItem | None = None
        self._mcp_open: tuple[McpTarget, str] | None = None  # an MCP call being written: its target, item id
        self._args = ""
        self.error: str | None = None  # why a call was malformed (the first such)
        self.unterminated = False
        self.started: list[tuple[McpTarget, McpCallItem, int]] = []  # MCP calls to run (taken by the session)
        self.approvals: list[tuple[McpTarget, McpApprovalRequestItem]] = []  # requests to wait for (same)
        self.pending: set[str] = set()  # mcp_call item ids running

    def views(self) -> tuple[CallItem, ...]:
        """The call items for `response.done` `output`."""
        return tuple(self.items)

    def _ids(self, item: FunctionCallItem) -> dict:
        assert item.id is not None and item.call_id is not None
        return {"response_id": self.response_id, "item_id": item.id, "output_index": self._indexes[item.id],
                "call_id": item.call_id}

    def on_event(self, event: ToolCallStart | ToolCallArguments | ToolCallEnd) -> list[ServerEvent]:
        """Engine call event -> wire events (and conversation items)."""
        if isinstance(event, ToolCallStart):
            events = self._close(ItemStatus.INCOMPLETE) + self._end_mcp(None, "a new call began")
            target = self._mcp_target(event.name)
            return events + (self._start(event.name) if target is None else self._start_mcp(target))
        if self._mcp_open is not None:
            return self._on_mcp_event(event)
        if isinstance(event, ToolCallArguments):
            if self._open is None or not event.delta:
                return []
            self._args += event.delta
            return [ResponseFunctionCallArgumentsDelta(**self._ids(self._open), delta=event.delta)]
        if event.error is not None:
            self.error = self.error or event.error
            self.unterminated = self.unterminated or "unterminated" in event.error
            return self._close(ItemStatus.INCOMPLETE)
        assert event.arguments is not None
        if self._open is None:  # cannot happen: the parser starts every well-formed call
            return []
        item = self._open
        extra: list[ServerEvent] = []
        if event.arguments.startswith(self._args) and len(event.arguments) > len(self._args):
            extra.append(ResponseFunctionCallArgumentsDelta(**self._ids(item), delta=event.arguments[len(self._args):]))
        self._args = event.arguments
        done = ResponseFunctionCallArgumentsDone(**self._ids(item), name=item.name, arguments=event.arguments)
        return extra + [done] + self._close(ItemStatus.COMPLETED)

    def _start(self, name: str) -> list[ServerEvent]:
        events: list[ServerEvent] = []
        item = FunctionCallItem(name=name, arguments="", call_id=new_id(IdPrefix.CALL), id=new_id(IdPrefix.ITEM),
                                status=ItemStatus.IN_PROGRESS)
        assert item.id is not None
        self._indexes[item.id] = self._next_index()
        self.items.append(item)
        self._open, self._args = item, ""
        events.append(ResponseOutputItemAdded(response_id=self.response_id, output_index=self._indexes[item.id],
                                              item=item))
        if self._conversation is not None:
            previous = self._conversation.last_id()
            self._conversation.insert(StoredItem(item))
            events.append(ConversationItemAdded(item=item, previous_item_id=previous))
        return events

    def _close(self, status: ItemStatus) -> list[ServerEvent]:
        """End the open call item with `status` (its arguments as received)."""
        item = self._open
        if item is None:
            return []
        self._open = None
        index = self.items.index(item)
        done = FunctionCallItem(name=item.name, arguments=self._args, call_id=item.call_id, id=item.id, status=status)
        self.items[index] = done
        events: list[ServerEvent] = [ResponseOutputItemDone(response_id=self.response_id,
                                                            output_index=self._indexes[item.id], item=done)]
        if self._conversation is not None and done.id in self._conversation:
            entry = self._conversation.get(done.id)
            assert isinstance(entry, StoredItem)
            entry.item = done
            events.append(ConversationItemDone(item=done))
        return events

    def finish(self) -> list[ServerEvent]:
        """The response ends (cancelled, failed): an open call item ends incomplete."""
        return self._close(ItemStatus.INCOMPLETE) + self._end_mcp(None, "the response ended before the call was"
                                                                        " written")

    # ---- MCP calls -------------------------------------------------------------------------------------
    def _add(self, item: CallItem) -> list[ServerEvent]:
        """Announce a new item at the next output index (and add it to the conversation)."""
        self._indexes[item.id] = self._next_index()
        self.items.append(item)
        events: list[ServerEvent] = [ResponseOutputItemAdded(response_id=self.response_id,
                                                             output_index=self._indexes[item.id], item=item)]
        if self._conversation is not None:
            previous = self._conversation.last_id()
            self._conversation.insert(StoredItem(item))
            events.append(ConversationItemAdded(item=item, previous_item_id=previous))
        return events

    def _replace(self, item: CallItem) -> list[ServerEvent]:
        """`item` is final: `response.output_item.done` (and `conversation.item.done`)."""
        self.items = [item if i.id == item.id else i for i in self.items]
        events: list[ServerEvent] = [ResponseOutputItemDone(response_id=self.response_id,
                                                            output_index=self._indexes[item.id], item=item)]
        entry = None if self._conversation is None else self._conversation.get(item.id)
        if isinstance(entry, StoredItem):
            entry.item = item
            events.append(ConversationItemDone(item=item))
        return events

    def _start_mcp(self, target: McpTarget) -> list[ServerEvent]:
        """An MCP tool call begins: its `mcp_call` item now, or (approval needed) nothing until it is written."""
        self._args = ""
        if target.needs_approval:
            self._mcp_open = (target, "")
            return []
        item = McpCallItem(id=new_id(IdPrefix.ITEM), server_label=target.server.server_label, name=target.info.name,
                           arguments="")
        self._mcp_open = (target, item.id)
        return self._add(item)

    def _on_mcp_event(self, event: ToolCallArguments | ToolCallEnd) -> list[ServerEvent]:
        assert self._mcp_open is not None
        target, item_id = self._mcp_open
        if isinstance(event, ToolCallArguments):
            self._args += event.delta
            if not item_id or not event.delta:
                return []
            return [ResponseMcpCallArgumentsDelta(response_id=self.response_id, item_id=item_id,
                                                  output_index=self._indexes[item_id], delta=event.delta)]
        if event.error is not None:
            self.error = self.error or event.error
            self.unterminated = self.unterminated or "unterminated" in event.error
            return self._end_mcp(None, event.error)
        assert event.arguments is not None
        return self._end_mcp(event.arguments, None)

    def _end_mcp(self, arguments: str | None, error: str | None) -> list[ServerEvent]:
        """The MCP call being written ends: with its `arguments` (run it, or ask for approval) or malformed
        (`error`: the item fails, nothing is called)."""
        if self._mcp_open is None:
            return []
        (target, item_id), self._mcp_open = self._mcp_open, None
        if arguments is None:
            if not item_id:
                return []
            item = next(i for i in self.items if i.id == item_id)
            failed = replace(item, arguments=self._args,
                             error=McpCallError("tool_execution_error", f"the model's call was not run: {error}"))
            return self._replace(failed)
        if not item_id:
            request = McpApprovalRequestItem(id=new_id(IdPrefix.ITEM), server_label=target.server.server_label,
                                             name=target.info.name, arguments=arguments)
            self.approvals.append((target, request))
            return self._add(request) + self._replace(request)
        events: list[ServerEvent] = []
        if arguments.startswith(self._args) and len(arguments) > len(self._args):
            events.append(ResponseMcpCallArgumentsDelta(response_id=self.response_id, item_id=item_id,
                                                        output_index=self._indexes[item_id],
                                                        delta=arguments[len(self._args):]))
        events.append(ResponseMcpCallArgumentsDone(response_id=self.response_id, item_id=item_id,
                                                   output_index=self._indexes[item_id], arguments=arguments))
        item = replace(next(i for i in self.items if i.id == item_id), arguments=arguments)
        self.items = [item if i.id == item_id else i for i in self.items]
        entry = None if self._conversation is None else self._conversation.get(item_id)
        if isinstance(entry, StoredItem):
            entry.item = item
        self.started.append((target, item, self._indexes[item_id]))
        self.pending.add(item_id)
        return events

    def settle(self, item: McpCallItem) -> list[ServerEvent]:
        """A call this response started settled (`item` holds its output or error): `response.output_item.done`."""
        self.pending.discard(item.id)
        return self._replace(item)

    def failure(self) -> ErrorDetail | None:
        """`status_details.error` when the model wrote a malformed call."""
        if self.error is None:
            return None
        code = ErrorCode.INVALID_TOOL_CALL
        return ErrorDetail(type=code.error_type.value, code=code.value,
                           message=code.render(response_id=self.response_id, detail=self.error))
