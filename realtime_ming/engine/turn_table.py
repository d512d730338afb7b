"""The engine's turn table: the active turns, the parked speculative ones, and the delivery of their events.

Each turn's events go to its `sink` (the session layer's, `engine/commands.py` `Sink`), in order, under the table's
lock, which also orders a turn's terminal event after everything else of it (the engine's death fails turns from
another thread). A speculative turn's events are held (`TurnState.held`) until it is confirmed; one that ends while
unconfirmed is parked, terminal event included, until `confirm` or `discard` (`engine/speculation.py`).

Ending a turn frees its rows through `release` (the engine's thinker and talker) and delivers its terminal event.
The engine thread owns the table; `fail_all` (the engine's death) may come from any thread.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from .api import FailureCode, FinishReason, Stage, StageMark, TurnDone, TurnEvent, TurnFailed
from .commands import Sink
from .supervision import FaultLog
from .turn_state import TurnState

__all__ = ["TurnTable"]


class TurnTable:
    """Active turns by id (`turns`), parked speculative ones (`parked`) and the delivery of their events."""

    def __init__(self, faults: FaultLog, release: Callable[[str], None]):
        self.turns: dict[str, TurnState] = {}
        self.parked: dict[str, TurnState] = {}  # speculative turns that ended before confirm/discard
        self.lock = threading.RLock()  # orders every delivery to a sink
        self.faults = faults
        self._release = release  # frees a turn's thinker row and talker streams

    def guarded(self, place: str, fn: Callable, *args) -> None:
        """Run `fn`; a failure is logged (`FaultLog`), never raised."""
        try:
            fn(*args)
        except Exception as exc:
            self.faults.report(place, exc)

    # ---- delivery --------------------------------------------------------------------------------
    def call_sink(self, sink: Sink, event: TurnEvent) -> None:
        """Deliver one event; a sink that raises is the caller's bug: logged, never the engine's death."""
        try:
            sink(event)
        except Exception as exc:
            self.faults.report("a turn's event sink", exc)

    def mark(self, turn: TurnState, stage: Stage) -> None:
        t = time.monotonic()
        turn.stages[stage] = t
        self.emit(turn, StageMark(turn.request.turn_id, stage, t))

    def emit(self, turn: TurnState, event: TurnEvent) -> None:
        with self.lock:
            if turn.ended:
                return
            if turn.held is not None:
                turn.held.append(event)
            else:
                self.call_sink(turn.sink, event)

    def emit_terminal(self, turn: TurnState, event: TurnEvent) -> None:
        """A turn's last event, delivered now (an unconfirmed speculative turn ends silently)."""
        with self.lock:
            if turn.ended:
                return
            turn.ended = True
            if turn.held is None:
                self.call_sink(turn.sink, event)

    # ---- ending ----------------------------------------------------------------------------------
    def release(self, turn_id: str) -> None:
        """Free a turn's rows; a failure is logged (the turn ends anyway)."""
        self.guarded(f"releasing turn {turn_id}", self._release, turn_id)

    def finish(self, turn_id: str, turn: TurnState) -> None:
        """End a turn that is done: its DONE mark, then `TurnDone` with its usage, stages and audio."""
        self.mark(turn, Stage.DONE)
        prompt, cached, output = turn.usage
        self.end(turn_id, turn, TurnDone(turn_id, turn.text, turn.finish or FinishReason.STOP, prompt, cached,
                                         output, turn.audio_samples, dict(turn.stages), *turn.by_modality,
                                         talker_steps=turn.talker_steps))

    def fail(self, turn_id: str, message: str, code: FailureCode) -> None:
        turn = self.turns.get(turn_id)
        if turn is not None:
            self.end(turn_id, turn, TurnFailed(turn_id, message, code))

    def end(self, turn_id: str, turn: TurnState, event: TurnEvent) -> None:
        """Free the turn's rows and deliver its terminal event (parked while speculative)."""
        self.turns.pop(turn_id, None)
        self.release(turn_id)
        self.terminal(turn_id, turn, event)

    def terminal(self, turn_id: str, turn: TurnState, event: TurnEvent) -> None:
        with self.lock:
            if turn.ended:
                return
            turn.ended = True
            if turn.held is not None:
                turn.held.append(event)
                self.parked[turn_id] = turn
            else:
                self.call_sink(turn.sink, event)

    def fail_all(self, message: str) -> None:
        """Fail every active turn (the engine died; any thread, under the lock)."""
        with self.lock:
            for turn_id, turn in dict(self.turns).items():  # a copy: the engine thread may be stuck mid-step
                self.terminal(turn_id, turn, TurnFailed(turn_id, message, FailureCode.ENGINE_UNAVAILABLE))
            self.turns.clear()
