"""Function tools for SDK agents: register Python functions; the agent runs them when the model calls.

`ToolRunner` watches the server events an agent reads: a completed `function_call` item whose name has a
handler starts the handler at once (a coroutine function runs on the loop, a plain function in a worker
thread) with the call's JSON arguments as keyword arguments. When that response's `response.done` arrives,
the runner sends each result as a `function_call_output` item (a string as is, anything else as JSON; an
exception as `{"error": "<Type>: <message>"}`) and then asks for the follow-up response, so the model
answers from the results. Calls of functions without a handler are left to the application (the events
still arrive).

The follow-up is asked for exactly once and never lost. A conversation has one active response at a time:
while another one is active (server VAD answering the user, the application's own request) the
`response.create` waits for its `response.done`. A response that the server created after the results
entered the conversation (their `conversation.item.added` was read before its `response.created`) sees
them and is the follow-up: nothing more is sent. The runner's own request carries
`metadata: {"realtime_ming_sdk.tool_follow_up": <its event id>}`, by which its `response.created` is known. When the request races such a response anyway and is
refused with `conversation_already_has_active_response`, that refusal is the runner's own business: it
is not delivered to the application, and the request is made again after the active response is done,
unless that response saw the results.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import types
import typing
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..protocol import client_events as ce
from ..protocol.error_codes import ErrorCode
from ..protocol.events import ServerEvent
from ..protocol.ids import IdPrefix, new_id
from ..protocol.items import FunctionCallItem, FunctionCallOutputItem, ItemStatus
from ..protocol.server_events import (
    ConversationItemAdded,
    Error,
    ResponseCreated,
    ResponseDone,
    ResponseOutputItemDone,
)
from ..protocol.values import FunctionTool

__all__ = ["ToolCallResult", "ToolRunner", "function_schema"]

log = logging.getLogger(__name__)

_JSON_TYPES: Mapping[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                                  list: "array", dict: "object"}


def function_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """A JSON schema of `fn`'s keyword parameters from their annotations (str/int/float/bool/list/dict,
    `X | None`); parameters without a default are required."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    hints = typing.get_type_hints(fn)
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = hints.get(name, Any)
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
            hint = args[0]
        kind = _JSON_TYPES.get(typing.get_origin(hint) or hint)
        properties[name] = {"type": kind} if kind is not None else {}
        if param.default is param.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


@dataclass(frozen=True, slots=True)
class ToolCallResult:
    """One handled call: its id, function, arguments text and the output sent back."""

    call_id: str
    name: str
    arguments: str
    output: str


FOLLOW_UP_KEY = "realtime_ming_sdk.tool_follow_up"  # `metadata` key of the runner's own response.create


@dataclass
class _FollowUp:
    """The response that answers the latest results (see the module doc)."""

    last_item_id: str  # the last `function_call_output` item of the results
    sent: bool = False  # every output was sent: the follow-up may be asked for
    included: bool = False  # the last output's `conversation.item.added` was read: later responses see them
    request_id: str | None = None  # our `response.create` (its event id) until created or refused
    answered_by: str | None = None  # the response that sees the results


@dataclass
class ToolRunner:
    """Handlers by function name, the calls in flight per response and the follow-up response (see the
    module doc)."""

    send: Callable[[Any], Awaitable[None]]
    handlers: dict[str, Callable[..., Any]] = field(default_factory=dict)
    tools: dict[str, FunctionTool] = field(default_factory=dict)
    results: list[ToolCallResult] = field(default_factory=list)
    _pending: dict[str, list[tuple[FunctionCallItem, asyncio.Task[str]]]] = field(default_factory=dict)
    _active: str | None = None  # the conversation's active response, as read so far
    _follow_up: _FollowUp | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def add(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
            parameters: Mapping[str, Any] | None = None) -> FunctionTool:
        """Register `fn` as function `name` (default: its `__name__`); the tool to put in the session."""
        tool = FunctionTool(name or fn.__name__, inspect.cleandoc(description or fn.__doc__ or ""),
                            dict(parameters) if parameters is not None else function_schema(fn))
        self.handlers[tool.name], self.tools[tool.name] = fn, tool
        return tool

    def observe(self, event: ServerEvent) -> bool:
        """Look at one server event as it is delivered (never blocks the reader). True: the event is the
        refusal of the runner's own follow-up request, handled here and not for the application."""
        if isinstance(event, ResponseOutputItemDone):
            item = event.item
            if (isinstance(item, FunctionCallItem) and item.status is ItemStatus.COMPLETED
                    and item.name in self.handlers and item.call_id is not None):
                task = asyncio.get_running_loop().create_task(self._run(item))
                self._pending.setdefault(event.response_id, []).append((item, task))
            return False
        follow_up = self._follow_up
        if isinstance(event, ConversationItemAdded):
            if follow_up is not None and event.item.id == follow_up.last_item_id:
                follow_up.included = True
        elif isinstance(event, ResponseCreated):
            response = event.response
            if response.conversation_id is not None:  # out-of-band responses neither block nor answer
                self._active = response.id
                if follow_up is not None:
                    if follow_up.request_id is not None and (response.metadata or {}).get(FOLLOW_UP_KEY) \
                            == follow_up.request_id:
                        follow_up.request_id = None  # ours, accepted
                    if follow_up.included and follow_up.answered_by is None:
                        follow_up.answered_by = response.id
        elif isinstance(event, ResponseDone):
            response_id = event.response.id
            if response_id == self._active:
                self._active = None
            if follow_up is not None and follow_up.answered_by == response_id:
                self._follow_up = None
            else:
                self._request_when_free()
            calls = self._pending.pop(response_id, None)
            if calls:
                self._spawn(self._reply(calls))
        elif (isinstance(event, Error) and follow_up is not None and follow_up.request_id is not None
              and event.error.event_id == follow_up.request_id):
            follow_up.request_id = None
            if event.error.code == ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE.value:
                log.debug("follow-up response deferred: response %s is active", self._active)
                return True  # asked again at that response's `response.done`, unless it sees the results
            self._follow_up = None  # refused for another reason: the application sees why
        return False

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _request_when_free(self) -> None:
        """Ask for the follow-up now if it is due and no response is active (one request at a time)."""
        follow_up = self._follow_up
        if (follow_up is not None and follow_up.sent and follow_up.answered_by is None
                and follow_up.request_id is None and self._active is None):
            follow_up.request_id = new_id(IdPrefix.EVENT)
            self._spawn(self._request(follow_up))

    async def _run(self, item: FunctionCallItem) -> str:
        fn = self.handlers[item.name]
        try:
            arguments = json.loads(item.arguments or "{}")
            if not isinstance(arguments, dict):
                raise TypeError("the arguments are not a JSON object")
            if inspect.iscoroutinefunction(fn):
                value = await fn(**arguments)
            else:
                value = await asyncio.to_thread(fn, **arguments)
        except Exception as exc:  # the model sees the failure and can recover; the agent goes on
            log.warning("tool %s failed: %s", item.name, exc)
            return json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)

    async def _reply(self, calls: list[tuple[FunctionCallItem, asyncio.Task[str]]]) -> None:
        ids = [new_id(IdPrefix.ITEM) for _ in calls]
        previous = self._follow_up  # results still waiting: one response answers them and these
        follow_up = self._follow_up = _FollowUp(ids[-1], request_id=None if previous is None else previous.request_id)
        try:
            for (item, task), item_id in zip(calls, ids, strict=True):
                output = await task
                assert item.call_id is not None
                await self.send(ce.ConversationItemCreate(item=FunctionCallOutputItem(
                    call_id=item.call_id, output=output, id=item_id)))
                self.results.append(ToolCallResult(item.call_id, item.name, item.arguments, output))
        except Exception as exc:  # the session ended meanwhile: nothing to answer
            log.info("tool results not sent: %s", exc)
            if self._follow_up is follow_up:
                self._follow_up = None
            return
        follow_up.sent = True
        if self._follow_up is follow_up:
            self._request_when_free()

    async def _request(self, follow_up: _FollowUp) -> None:
        assert follow_up.request_id is not None
        event = ce.ResponseCreate(event_id=follow_up.request_id,
                                  response=ce.ResponseParams(metadata={FOLLOW_UP_KEY: follow_up.request_id}))
        try:
            await self.send(event)
        except Exception as exc:  # the session ended meanwhile: nothing to answer
            log.info("follow-up response not requested: %s", exc)
            if self._follow_up is follow_up:
                self._follow_up = None
