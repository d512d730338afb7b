"""The talker on a thread of its own (`engine.talker.own_thread`): it steps at its own pace, not the thinker's.

In the default engine the talker's step is part of the engine step: one talker step per thinker step, so a turn's
talker work after its text (about as many steps again as it had tokens) is paid in thinker-sized steps, and the
engine thread waits for the talker's GPUs while the thinker's could start the next step. `TalkerLoop` wraps the
talker (a `TalkerRunner` or a `TalkerPool`) and runs it on its own thread: whenever a stream runs or a job waits,
it starts jobs, steps every stream once (or `engine.talker.thread_steps` times, queued back to back) and delivers
the PCM, then goes again; pipelined (`engine.talker.thread_pipeline`), it queues the next launch before finishing
the one in flight, and finishes that one first when a pause, forget or capture comes.

The engine thread talks to it only through thread-safe calls that never block on the talker's GPU work:
`enqueue`, `pause`, `resume` and `forget` are queued and applied by the loop between its steps, in order;
`pending(turn_id)` is answered from the engine thread's own count of the segments it queued and the loop's
report of the last one it saw through (`Idle`). The loop hands each step's outputs to `deliver` on its thread
(the engine emits PCM and stage marks from there, under its lock) and reports what only the engine thread may act on
(a turn whose talker work failed, a turn whose talker work is done) through `notify`, which wakes the engine.
A talker step that raises fails the turns it was running (their talker state is dropped) and the loop goes
on; anything worse (a BaseException) kills the engine through `die`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from .talker_runner import TalkerOutput

__all__ = ["Idle", "TalkerFailed", "TalkerHandle", "TalkerLoop"]

log = logging.getLogger(__name__)

_MAX_DROPPED = 4096  # turns remembered as dropped until the engine forgets them (a drop after the end never is)


@dataclass(frozen=True, slots=True)
class Idle:
    """The loop has no talker work left for `turn_id` after applying the engine's `seq`-th enqueue of it."""

    turn_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class TalkerFailed:
    turn_id: str
    message: str


class _Stop:
    pass


class TalkerHandle:
    """The engine's side of a talker stepped elsewhere (on a thread, `TalkerLoop`, or in a process,
    `talker_process.TalkerProcess`): enqueues sent per turn and the last `Idle` report of each (engine thread), and
    the turns whose output nobody takes any more (any thread)."""

    def __init__(self):
        self._sent: dict[str, int] = {}  # engine thread: enqueues sent per turn
        self._seen: dict[str, int] = {}  # engine thread: the last `Idle` seq per turn
        self._dropped: OrderedDict[str, None] = OrderedDict()  # any thread: turns whose output nobody takes
        self._drop_lock = threading.Lock()

    def _count_enqueue(self, turn_id: str) -> int:
        """The seq of `turn_id`'s next enqueue (its `Idle` reports name the last one seen through)."""
        seq = self._sent.get(turn_id, 0) + 1
        self._sent[turn_id] = seq
        return seq

    def pending(self, turn_id: str) -> bool:
        """Whether talker work the engine queued for `turn_id` is not known to be done."""
        return self._sent.get(turn_id, 0) != self._seen.get(turn_id, 0)

    def idle(self, event: Idle) -> None:
        """Record an `Idle` report (engine thread; a report about a forgotten turn is ignored)."""
        if event.turn_id in self._sent:
            self._seen[event.turn_id] = max(self._seen.get(event.turn_id, 0), event.seq)

    def drop(self, turn_id: str) -> None:
        """Any thread, at once (a cancel, a discard): no more output of `turn_id` is delivered, even before the
        engine thread applies the command and forgets the turn."""
        with self._drop_lock:
            self._dropped[turn_id] = None
            while len(self._dropped) > _MAX_DROPPED:
                self._dropped.popitem(last=False)

    def _forget_counts(self, turn_id: str) -> None:
        self._sent.pop(turn_id, None)
        self._seen.pop(turn_id, None)

    def _undrop(self, turn_id: str) -> None:
        with self._drop_lock:
            self._dropped.pop(turn_id, None)

    def _taken(self, outputs: list) -> list:
        """`outputs` less those of dropped turns."""
        with self._drop_lock:
            return [o for o in outputs if o.turn_id not in self._dropped]

    def has_work(self) -> bool:
        """The engine thread never steps this talker: its work keeps no engine step going."""
        return False


class TalkerLoop(TalkerHandle):
    """A talker stepped on its own thread. `deliver(outputs)` runs on that thread; `notify(events)` and
    `die(reason)` tell the engine thread what it must act on."""

    def __init__(self, talker, deliver: Callable[[list[TalkerOutput]], None],
                 notify: Callable[[list], None], die: Callable[[str], None], *, steps: int = 1,
                 pipeline: bool = False):
        super().__init__()
        self.talker = talker
        self.steps = max(1, int(steps))  # talker steps queued per launch (`engine.talker.thread_steps`)
        self.pipeline = pipeline  # the next launch queued before the last one is finished (`thread_pipeline`)
        self._inflight = None  # pipelined: the launch queued and not yet finished (loop thread)
        self._deliver, self._notify, self._die = deliver, notify, die
        self._ops: queue.SimpleQueue = queue.SimpleQueue()
        self._applied: dict[str, int] = {}  # loop thread: enqueues applied per turn
        # loop thread, running totals (`loop_stats`): seconds in launches, in finishes, waiting for work with none
        self._counts = {"launches": 0, "launch_s": 0.0, "finish_s": 0.0, "idle_s": 0.0}
        replica = getattr(talker, "replica", None)
        name = "realtime-ming-talker" if replica is None else f"realtime-ming-talker-{replica.index}"
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    # ---- engine thread ---------------------------------------------------------------------------
    def enqueue(self, turn_id: str, segment_id: int, text: str, voice, *, seed=None, caption=None) -> None:
        seq = self._count_enqueue(turn_id)
        self._ops.put(("enqueue", turn_id, seq, (segment_id, text, voice), {"seed": seed, "caption": caption}))

    def pause(self, turn_id: str) -> None:
        self._ops.put(("pause", turn_id))

    def resume(self, turn_id: str) -> None:
        self._ops.put(("resume", turn_id))

    def forget(self, turn_id: str) -> None:
        self._forget_counts(turn_id)
        self._ops.put(("forget", turn_id))

    @property
    def replica(self):
        """The replica this loop steps (a `TalkerPool` member)."""
        return self.talker.replica

    def num_streams(self) -> int:
        return self.talker.num_streams()  # a count read across threads: a snapshot

    def loop_stats(self) -> dict:
        """Running totals since start (a snapshot; any thread): launches and the loop's seconds in them (`launch_s`:
        starting jobs, queuing steps), in finishes (`finish_s`: waiting for the steps, stop decisions, VAE, PCM) and
        idle (`idle_s`: no work); the talker's host seconds starting jobs (`admit_s`), jobs started, steps queued and
        rows stepped (`rows`: streams summed over steps)."""
        return {**self._counts, **self.talker.counts}  # the loop's and its runner's (one runner: no pool here)

    def capture(self, progress=None) -> None:
        """Capture the talker's graphs on the loop's thread; waits, and raises what the capture raised."""
        done, errors = threading.Event(), []
        self._ops.put(("capture", progress, done, errors))
        done.wait()
        if errors:
            raise errors[0]

    def close(self, timeout: float = 10.0) -> None:
        self._ops.put(_Stop())
        self._thread.join(timeout)

    # ---- loop thread -----------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: B036 - the talker thread is dying: the engine cannot speak any more
            log.critical("talker thread died", exc_info=exc)
            self._die(f"talker thread died ({type(exc).__name__}: {exc})")

    def _run(self) -> None:
        while True:
            busy = self.talker.has_work() or self._inflight is not None
            t0 = time.perf_counter()
            try:
                op = self._ops.get(block=not busy)
            except queue.Empty:
                op = None
            if not busy:
                self._counts["idle_s"] += time.perf_counter() - t0
            touched: set[str] = set()
            events = []
            while op is not None:
                if isinstance(op, _Stop):
                    return
                if op[0] != "enqueue" and self._inflight is not None:  # only a launch may come between launch/finish
                    events += self._step(touched, launch=False)
                self._apply(op, touched)
                try:
                    op = self._ops.get_nowait()
                except queue.Empty:
                    op = None
            if self.talker.has_work() or self._inflight is not None:
                events += self._step(touched)
            events += [Idle(t, self._applied[t]) for t in touched
                       if t in self._applied and not self.talker.pending(t)]
            if events:
                self._notify(events)

    def _apply(self, op, touched: set[str]) -> None:
        kind = op[0]
        if kind == "enqueue":
            _, turn_id, seq, args, kw = op
            self._applied[turn_id] = seq
            self.talker.enqueue(turn_id, *args, **kw)
            touched.add(turn_id)
        elif kind == "pause":
            self.talker.pause(op[1])
        elif kind == "resume":
            self.talker.resume(op[1])
        elif kind == "forget":
            self._applied.pop(op[1], None)
            self._undrop(op[1])
            self.talker.forget(op[1])
        elif kind == "capture":
            _, progress, done, errors = op
            try:
                self.talker.capture(progress)
            except Exception as exc:  # reported to the capturing caller
                errors.append(exc)
            finally:
                done.set()

    def _step(self, touched: set[str], launch: bool = True) -> list:
        """One launch of every stream's steps and one finish, its outputs delivered (pipelined: the launch queued
        before the previous one is finished, which is the one delivered; `launch=False` only finishes it)
        -> the failures (a failed step fails its turns)."""
        counts = self._counts
        try:
            t0 = time.perf_counter()
            queued = self.talker.launch(self.steps, keep=self.pipeline) \
                if launch and self.talker.has_work() else None
            t1 = time.perf_counter()
            counts["launches"] += queued is not None
            counts["launch_s"] += t1 - t0
            if self.pipeline:
                queued, self._inflight = self._inflight, queued
            outputs = [] if queued is None else self.talker.finish(queued)
            counts["finish_s"] += time.perf_counter() - t1
        except Exception as exc:
            self._inflight = None
            log.exception("talker step failed")
            turns = {t for t in self._applied if self.talker.pending(t)}
            for turn_id in turns:
                self.talker.cancel(turn_id)
            return [TalkerFailed(t, f"talker error: {type(exc).__name__}: {exc}") for t in sorted(turns)]
        failed = [TalkerFailed(o.turn_id, o.error) for o in outputs if o.error is not None]
        delivered = self._taken([o for o in outputs if o.error is None])
        touched.update(o.turn_id for o in outputs)
        try:
            self._deliver(delivered)
        except Exception as exc:  # the engine could not take this step's outputs: their turns fail, not the loop
            log.exception("delivering talker outputs failed")
            for turn_id in sorted({o.turn_id for o in delivered}):
                self.talker.cancel(turn_id)
                failed.append(TalkerFailed(turn_id, f"talker output: {type(exc).__name__}: {exc}"))
        return failed
