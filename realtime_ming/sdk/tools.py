"""Function tools for SDK agents: register Python functions; the agent runs them when the model calls.

`ToolRunner` watches the server events an agent reads: a completed `function_call` item whose name has a
handler starts the handler at once (a coroutine function runs on the loop, a plain function in a worker
thread) with the call's JSON arguments as keyword arguments. When that response's `response.done` arrives,
the runner sends each result as a `function_call_output` item (a string as is, anything else as JSON; an
exception as `{"error": "<Type>: <message>"}`) and then one `response.create`, so the model answers from
the results. Calls of functions without a handler are left to the application (the events still arrive).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..protocol import client_events as ce
from ..protocol.events import ServerEvent
from ..protocol.items import FunctionCallItem, FunctionCallOutputItem, ItemStatus
from ..protocol.server_events import ResponseDone, ResponseOutputItemDone
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


@dataclass
class ToolRunner:
    """Handlers by function name and the calls in flight per response (see the module doc)."""

    send: Callable[[Any], Awaitable[None]]
    handlers: dict[str, Callable[..., Any]] = field(default_factory=dict)
    tools: dict[str, FunctionTool] = field(default_factory=dict)
    results: list[ToolCallResult] = field(default_factory=list)
    _pending: dict[str, list[tuple[FunctionCallItem, asyncio.Task[str]]]] = field(default_factory=dict)

    def add(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
            parameters: Mapping[str, Any] | None = None) -> FunctionTool:
        """Register `fn` as function `name` (default: its `__name__`); the tool to put in the session."""
        tool = FunctionTool(name or fn.__name__, inspect.cleandoc(description or fn.__doc__ or ""),
                            dict(parameters) if parameters is not None else function_schema(fn))
        self.handlers[tool.name], self.tools[tool.name] = fn, tool
        return tool

    def observe(self, event: ServerEvent) -> None:
        """Look at one server event as it is delivered (never blocks the reader)."""
        if isinstance(event, ResponseOutputItemDone):
            item = event.item
            if (isinstance(item, FunctionCallItem) and item.status is ItemStatus.COMPLETED
                    and item.name in self.handlers and item.call_id is not None):
                task = asyncio.get_running_loop().create_task(self._run(item))
                self._pending.setdefault(event.response_id, []).append((item, task))
        elif isinstance(event, ResponseDone):
            calls = self._pending.pop(event.response.id, None)
            if calls:
                asyncio.get_running_loop().create_task(self._reply(calls))

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
        try:
            for item, task in calls:
                output = await task
                assert item.call_id is not None
                await self.send(ce.ConversationItemCreate(item=FunctionCallOutputItem(call_id=item.call_id,
                                                                                      output=output)))
                self.results.append(ToolCallResult(item.call_id, item.name, item.arguments, output))
            await self.send(ce.ResponseCreate(response=ce.ResponseParams()))
        except Exception as exc:  # the session ended meanwhile: nothing to answer
            log.info("tool results not sent: %s", exc)
