"""A fake Ray actor method for the cluster's pieces tested without Ray."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ActorMethod:
    """`actor.method`: `remote(*args)` returns an awaitable of `fn(*args)` (None without `fn`); `calls` records
    the arguments of every call."""

    def __init__(self, fn: Callable[..., Any] | None = None) -> None:
        self.calls: list[tuple] = []
        self._fn = fn

    async def _call(self, *args: Any) -> Any:
        self.calls.append(args)
        return None if self._fn is None else self._fn(*args)

    def remote(self, *args: Any):
        return self._call(*args)
