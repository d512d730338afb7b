"""The server's view of its engine turns: what is in flight (for a graceful drain) and no new turn while draining.

`TurnTracker` wraps the `EngineHandle` the sessions use. It counts the turns submitted and not yet ended
(a terminal event, or a discard), and once `drain()` is called it refuses new non-speculative turns with
`TurnFailed(SHUTTING_DOWN)` (the session reports `server_shutting_down`; a dead engine's own
`engine_unavailable` wins), so the in-flight set only
shrinks. Speculative turns still pass: one may already be promised to the client (confirmed later), and
a discard or a terminal event ends it like any other.
"""

from __future__ import annotations

import asyncio
import threading
import time

from ..engine.api import (
    EngineHandle,
    EngineHealth,
    FailureCode,
    TurnCancelled,
    TurnDone,
    TurnFailed,
    TurnRequest,
    TurnTask,
    engine_health,
    engine_supports,
)

__all__ = ["TurnTracker"]

_TERMINAL = (TurnDone, TurnCancelled, TurnFailed)


class TurnTracker:
    """An `EngineHandle` over `engine` that knows which turns are in flight (thread-safe)."""

    def __init__(self, engine: EngineHandle) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._active: set[str] = set()
        self._draining = False

    @property
    def draining(self) -> bool:
        return self._draining

    def in_flight(self) -> int:
        """Turns submitted and not ended yet."""
        with self._lock:
            return len(self._active)

    def drain(self) -> None:
        """From now on, refuse new non-speculative turns (in-flight ones run to their end)."""
        self._draining = True

    async def wait_idle(self, timeout_s: float, poll_s: float = 0.02) -> bool:
        """Wait until no turn is in flight; False when `timeout_s` passed first."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    def _ended(self, turn_id: str) -> None:
        with self._lock:
            self._active.discard(turn_id)

    # ---- EngineHandle ---------------------------------------------------------------------------
    def submit(self, request: TurnRequest, sink) -> None:
        if self._draining and not request.speculative and engine_health(self._engine).alive:
            sink(TurnFailed(request.turn_id, "server shutting down", FailureCode.SHUTTING_DOWN))
            return
        turn_id = request.turn_id

        def tracked(event) -> None:
            if isinstance(event, _TERMINAL):
                self._ended(turn_id)
            sink(event)

        with self._lock:
            self._active.add(turn_id)
        try:
            self._engine.submit(request, tracked)
        except BaseException:
            self._ended(turn_id)
            raise

    def confirm(self, turn_id: str) -> None:
        self._engine.confirm(turn_id)

    def discard(self, turn_id: str) -> None:
        self._ended(turn_id)  # a discarded turn ends without a terminal event
        self._engine.discard(turn_id)

    def cancel(self, turn_id: str) -> None:
        self._engine.cancel(turn_id)

    def close_conversation(self, conversation_id: str) -> None:
        self._engine.close_conversation(conversation_id)

    def health(self) -> EngineHealth:
        return engine_health(self._engine)

    def supports(self, task: TurnTask) -> bool:
        return engine_supports(self._engine, task)
