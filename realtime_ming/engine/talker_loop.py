"""The talker process's loop: a talker replica stepped at its own pace, not the thinker's (`talker_process.py`).

Stepped inline, the talker's step is part of the engine step: one talker step per thinker step, so a turn's talker
work after its text (about as many steps again as it had tokens) is paid in thinker-sized steps. `TalkerLoop` runs a
`TalkerRunner` on a thread of its own inside the talker process: whenever a stream runs or a job waits, it starts
jobs, steps every stream once (or `engine.talker.steps_per_launch` times, queued back to back) and delivers the PCM,
then goes again; pipelined (`engine.talker.pipeline`), it queues the next launch before finishing the one in
flight, and finishes that one first when a pause, forget or capture comes. The loop's thread makes the replica's
device its current one for its whole life (`enter_device`): CUDA's current device is per host thread and a new
thread starts on cuda:0, so a replica on another GPU would otherwise have any CUDA call the runner's device guards
do not cover (a free, an event, a stream lookup) go to cuda:0, beside another process's thinker.

The ops (`talker_driver.Enqueue`, `Pause`, `Resume`, `Forget`, and `Drop`) come through `submit` from any thread and
are applied between the loop's steps, in order. The loop hands each step's outputs to `deliver` (less those of
dropped turns; an empty list after ops that ran no step, so the deliverer can report the streams left) and reports
through `notify` what only the engine thread may act on: failed turns (a `TalkerOutput` with `error`) and `Idle` (no
talker work left for a turn after its `seq`-th enqueue). A talker step that raises fails the turns it was running
(their talker state is dropped) and the loop goes on; anything worse (a BaseException) is reported through `die`.
`trace` (optional) hears the loop's first milestones once each (its thread on its device, the first op applied, the
first launch queued, the first finish): a talker process reports them as its start-up phases (`talker_child.py`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import torch

from .talker_driver import Enqueue, Forget, Idle, TalkerOp, apply_op
from .talker_runner import TalkerOutput, TalkerRunner

__all__ = ["Dropped", "Drop", "TalkerLoop", "enter_device", "failed"]

log = logging.getLogger(__name__)

_MAX_DROPPED = 4096  # turns remembered as dropped until the engine forgets them (a drop after the end never is)


@dataclass(frozen=True, slots=True)
class Drop:
    """No more output of the turn is delivered (a cancel or discard on its way to the engine thread)."""

    turn_id: str


@dataclass(slots=True)
class Capture:
    """Capture the runner's graphs on the loop's thread; `done` is set once `errors` holds what it raised."""

    progress: Callable | None = None
    done: threading.Event = field(default_factory=threading.Event)
    errors: list = field(default_factory=list)


class _Stop:
    pass


def enter_device(device: torch.device | str) -> None:
    """Make `device` the calling thread's current CUDA device (nothing off CUDA)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)


def failed(turn_id: str, message: str) -> TalkerOutput:
    """A turn whose talker work failed as a whole (no segment in particular)."""
    return TalkerOutput(turn_id, -1, None, error=message)


class Dropped:
    """Turns whose output nobody takes any more (any thread; bounded, oldest forgotten first)."""

    def __init__(self):
        self._turns: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, turn_id: str) -> None:
        with self._lock:
            self._turns[turn_id] = None
            while len(self._turns) > _MAX_DROPPED:
                self._turns.popitem(last=False)

    def discard(self, turn_id: str) -> None:
        with self._lock:
            self._turns.pop(turn_id, None)

    def taken(self, outputs: list) -> list:
        """`outputs` less those of dropped turns."""
        with self._lock:
            return [o for o in outputs if o.turn_id not in self._turns]


class TalkerLoop:
    """A runner stepped on its own thread. `deliver(outputs)` runs on that thread; `notify(events)` and `die(reason)`
    tell the engine what it must act on."""

    def __init__(self, runner: TalkerRunner, deliver: Callable[[list[TalkerOutput]], None],
                 notify: Callable[[list], None], die: Callable[[str], None], *, steps: int = 1,
                 pipeline: bool = False, trace: Callable[[str], None] | None = None):
        self.runner = runner
        self._trace = trace
        # loop thread: the milestones not yet traced (each once; empty without `trace`, so a step checks nothing more)
        self._firsts = set() if trace is None else {"first op applied", "first step launched", "first step finished"}
        self.steps = max(1, int(steps))  # talker steps queued per launch (`engine.talker.steps_per_launch`)
        self.pipeline = pipeline  # the next launch queued before the last one is finished (`engine.talker.pipeline`)
        self._inflight = None  # pipelined: the launch queued and not yet finished (loop thread)
        self._deliver, self._notify, self._die = deliver, notify, die
        self._ops: queue.SimpleQueue = queue.SimpleQueue()
        self._dropped = Dropped()
        self._applied: dict[str, int] = {}  # loop thread: enqueues applied per turn
        # loop thread, running totals (`stats`): seconds in launches, in finishes, waiting for work with none
        self._counts = {"launches": 0, "launch_s": 0.0, "finish_s": 0.0, "idle_s": 0.0}
        self._thread = threading.Thread(target=self._main, name=f"realtime-ming-talker-{runner.replica.index}",
                                        daemon=True)
        self._thread.start()

    # ---- any thread --------------------------------------------------------------------------------
    def submit(self, op: TalkerOp | Drop) -> None:
        """Queue an op for the loop (a `Drop` takes effect at once: nothing to queue)."""
        if isinstance(op, Drop):
            self._dropped.add(op.turn_id)
        else:
            self._ops.put(op)

    def stats(self) -> dict:
        """Running totals since start (a snapshot): launches and the loop's seconds in them (`launch_s`: starting jobs,
        queuing steps), in finishes (`finish_s`: waiting for the steps, stop decisions, VAE, PCM) and idle (`idle_s`:
        no work); the runner's host seconds starting jobs (`admit_s`), jobs started, steps queued and rows stepped
        (`rows`: streams summed over steps)."""
        return {**self._counts, **self.runner.counts}

    def capture(self, progress=None) -> None:
        """Capture the runner's graphs on the loop's thread; waits, and raises what the capture raised (or that the
        thread is gone: it would never take the capture)."""
        op = Capture(progress)
        self._ops.put(op)
        while not op.done.wait(0.5):
            if not self._thread.is_alive():
                raise RuntimeError("the talker loop's thread is gone: no capture")
        if op.errors:
            raise op.errors[0]

    def close(self, timeout: float = 10.0) -> None:
        self._ops.put(_Stop())
        self._thread.join(timeout)

    # ---- loop thread -------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            enter_device(self.runner.device)
            self._note(f"loop thread on {self.runner.device}")
            self._run()
        except BaseException as exc:  # noqa: B036 - the talker thread is dying: the engine cannot speak any more
            log.critical("talker thread died", exc_info=exc)
            self._die(f"talker thread died ({type(exc).__name__}: {exc})")

    def _run(self) -> None:
        while True:
            busy = self.runner.has_work() or self._inflight is not None
            t0 = time.perf_counter()
            try:
                op = self._ops.get(block=not busy)
            except queue.Empty:
                op = None
            if not busy:
                self._counts["idle_s"] += time.perf_counter() - t0
            touched: set[str] = set()
            events, applied = [], op is not None
            while op is not None:
                if isinstance(op, _Stop):
                    return
                # only a launch may come between a launch and its finish
                if not isinstance(op, Enqueue) and self._inflight is not None:
                    events += self._step(touched, launch=False)
                self._apply(op, touched)
                if self._firsts and not isinstance(op, Capture):
                    self._first("first op applied")
                try:
                    op = self._ops.get_nowait()
                except queue.Empty:
                    op = None
            if self.runner.has_work() or self._inflight is not None:
                events += self._step(touched)
            elif applied:  # ops without a step (a forget, a pause): `deliver` sees the streams left all the same
                self._deliver_nothing()
            events += [Idle(t, self._applied[t]) for t in touched
                       if t in self._applied and not self.runner.pending(t)]
            if events:
                self._notify(events)

    def _first(self, milestone: str) -> None:
        if milestone in self._firsts:
            self._firsts.discard(milestone)
            self._note(milestone)

    def _note(self, milestone: str) -> None:
        """Tell `trace` (a failing trace, e.g. a closed pipe, stops nothing: the loop's own work goes on)."""
        if self._trace is None:
            return
        try:
            self._trace(milestone)
        except Exception as exc:
            log.debug("talker loop: tracing %r failed: %s", milestone, exc)

    def _deliver_nothing(self) -> None:
        try:
            self._deliver([])
        except Exception:  # nothing was delivered: no turn to fail
            log.exception("reporting the talker's streams failed")

    def _apply(self, op, touched: set[str]) -> None:
        match op:
            case Enqueue(turn_id=turn_id):
                self._applied[turn_id] = self._applied.get(turn_id, 0) + 1
                apply_op(self.runner, op)
                touched.add(turn_id)
            case Forget(turn_id=turn_id):
                self._applied.pop(turn_id, None)
                self._dropped.discard(turn_id)
                apply_op(self.runner, op)
            case Capture():
                try:
                    self.runner.capture(op.progress)
                except Exception as exc:  # reported to the capturing caller
                    op.errors.append(exc)
                finally:
                    op.done.set()
            case _:
                apply_op(self.runner, op)

    def _step(self, touched: set[str], launch: bool = True) -> list:
        """One launch of every stream's steps and one finish, its outputs delivered (pipelined: the launch queued
        before the previous one is finished, which is the one delivered; `launch=False` only finishes it)
        -> the failures (a failed step fails its turns)."""
        counts = self._counts
        try:
            t0 = time.perf_counter()
            queued = self.runner.launch(self.steps, keep=self.pipeline) \
                if launch and self.runner.has_work() else None
            t1 = time.perf_counter()
            counts["launches"] += queued is not None
            counts["launch_s"] += t1 - t0
            if self._firsts and queued is not None:
                self._first("first step launched")
            if self.pipeline:
                queued, self._inflight = self._inflight, queued
            outputs = [] if queued is None else self.runner.finish(queued)
            counts["finish_s"] += time.perf_counter() - t1
            if self._firsts and queued is not None:
                self._first("first step finished")
        except Exception as exc:
            self._inflight = None
            log.exception("talker step failed")
            turns = {t for t in self._applied if self.runner.pending(t)}
            for turn_id in turns:
                self.runner.cancel(turn_id)
            return [failed(t, f"talker error: {type(exc).__name__}: {exc}") for t in sorted(turns)]
        errors = [o for o in outputs if o.error is not None]
        delivered = self._dropped.taken([o for o in outputs if o.error is None])
        touched.update(o.turn_id for o in outputs)
        try:
            self._deliver(delivered)
        except Exception as exc:  # the engine could not take this step's outputs: their turns fail, not the loop
            log.exception("delivering talker outputs failed")
            for turn_id in sorted({o.turn_id for o in delivered}):
                self.runner.cancel(turn_id)
                errors.append(failed(turn_id, f"talker output: {type(exc).__name__}: {exc}"))
        return errors
