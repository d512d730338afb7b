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

from ..engine.api import ToolCallArguments, ToolCallEnd, ToolCallStart
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.events import ServerEvent
from ..protocol.ids import IdPrefix, new_id
from ..protocol.items import FunctionCallItem, ItemStatus
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
    if choice is ToolChoiceMode.REQUIRED and not names:
        raise ProtocolError(ErrorCode.TOOL_CHOICE_UNKNOWN_FUNCTION, param=param, name="(any)", names="none")


class ResponseCalls:
    """The function-call items of one response; each takes the output index `next_index()` gives when it starts
    (after the message item, or first when the response forces a call)."""

    def __init__(self, response_id: str, conversation: Conversation | None, next_index: Callable[[], int]) -> None:
        self.response_id = response_id
        self._conversation = conversation
        self._next_index = next_index
        self._indexes: dict[str, int] = {}  # item id -> output index
        self.items: list[FunctionCallItem] = []
        self._open: FunctionCallItem | None = None
        self._args = ""
        self.error: str | None = None  # why a call was malformed (the first such)
        self.unterminated = False

    def views(self) -> tuple[FunctionCallItem, ...]:
        """The call items for `response.done` `output`."""
        return tuple(self.items)

    def _ids(self, item: FunctionCallItem) -> dict:
        assert item.id is not None and item.call_id is not None
        return {"response_id": self.response_id, "item_id": item.id, "output_index": self._indexes[item.id],
                "call_id": item.call_id}

    def on_event(self, event: ToolCallStart | ToolCallArguments | ToolCallEnd) -> list[ServerEvent]:
        """Engine call event -> wire events (and conversation items)."""
        if isinstance(event, ToolCallStart):
            return self._start(event.name)
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
        events = self._close(ItemStatus.INCOMPLETE) if self._open is not None else []
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
        return self._close(ItemStatus.INCOMPLETE)

    def failure(self) -> ErrorDetail | None:
        """`status_details.error` when the model wrote a malformed call."""
        if self.error is None:
            return None
        code = ErrorCode.INVALID_TOOL_CALL
        return ErrorDetail(type=code.error_type.value, code=code.value,
                           message=code.render(response_id=self.response_id, detail=self.error))
