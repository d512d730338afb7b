"""The inline talker driver (`engine.talker.driver: inline`, the default): the engine thread steps the talker.

Once per engine step the engine `launch`es the talker's step right after queuing the thinker's next one (its own
CUDA streams, so both run side by side) and waits for it in `outputs` (stop decisions, VAE, PCM): text routed to
the talker in one engine step is spoken from that same step. Ops are applied to the runner at once (the engine
thread is between steps whenever it sends one); PCM is delivered by the engine thread, so `drop` has nothing to do.

Pipelined (`engine.talker.pipeline`), `launch` queues this engine step's talker step before the last one is
finished and `outputs` finishes that last one: the GPU runs the new talker step (and the thinker's) while the host
reads the last one's stop decisions, VAE chunks and PCM, so the engine thread's host work no longer leaves the GPU
idle. The talker's output is then one engine step later (a turn's first audio included), and a stream is stepped
once more after its last step (the audio is the same, `TalkerRunner.launch(keep=True)`). As in a talker process's
loop (`engine/talker_loop.py`) only a launch may come between a launch and its finish: a pause, or a forget of a
turn with a stream in the rows, finishes the launch in flight first and its outputs wait for the next `outputs`.
"""

from __future__ import annotations

from .talker_driver import Enqueue, Forget, Pause, Resume, TalkerOp, apply_op
from .talker_runner import TalkerOutput, TalkerRunner
from .talker_step import Progress

__all__ = ["InlineTalker"]


class InlineTalker:
    """A `TalkerDriver` over one replica's `TalkerRunner`, stepped by the engine thread (engine thread only)."""

    def __init__(self, runner: TalkerRunner, pipeline: bool = False):
        self.runner = runner
        self.pipeline = pipeline
        self._launched = None  # the step `launch` queued, collected by `outputs`
        self._inflight = None  # pipelined: the launch queued by the last engine step, finished by this one's `outputs`
        self._ready: list[TalkerOutput] = []  # pipelined: outputs of a launch an op finished, for the next `outputs`

    @property
    def replica(self):
        return self.runner.replica

    def _apply(self, op: TalkerOp) -> None:
        apply_op(self.runner, op)

    def enqueue(self, op: Enqueue) -> None:
        self._apply(op)

    def pause(self, turn_id: str) -> None:
        self._settle()  # parking a stream copies its row state: no step of it may be left uncollected
        self._apply(Pause(turn_id))

    def resume(self, turn_id: str) -> None:
        self._apply(Resume(turn_id))

    def forget(self, turn_id: str) -> None:
        try:
            if self.runner.running(turn_id):  # its rows leave: their steps in flight are collected first
                self._settle()
        finally:  # a turn ends even when collecting what was in flight failed (`_settle` then dropped it)
            self._apply(Forget(turn_id))

    def drop(self, turn_id: str) -> None:
        """Nothing to do: only the engine thread delivers this talker's output, after applying the cancel."""

    def pending(self, turn_id: str) -> bool:
        # outputs an op finished early are the turn's too: it is not done before `outputs` hands them over
        return self.runner.pending(turn_id) or any(o.turn_id == turn_id for o in self._ready)

    def has_work(self) -> bool:
        return self.runner.has_work() or self._inflight is not None or bool(self._ready)

    def launch(self) -> None:
        if not self.pipeline:
            self._launched = self.runner.launch()
            return
        # the step queued now runs while `outputs` finishes the one the last engine step queued
        self._launched, self._inflight = self._inflight, None
        self._inflight = self.runner.launch(keep=True) if self.runner.has_work() else None

    def outputs(self) -> list[TalkerOutput]:
        launched, self._launched = self._launched, None
        ready, self._ready = self._ready, []
        try:
            return ready + ([] if launched is None else self.runner.finish(launched))
        except BaseException:
            self._inflight = None  # queued on top of the failed launch: the engine fails the turns in both
            raise

    def _settle(self) -> None:
        """Pipelined: finish what is in flight now (an op that moves rows comes next); its outputs wait for
        `outputs`. A finish that raises drops what is left in flight (the engine fails those turns)."""
        launches = [x for x in (self._launched, self._inflight) if x is not None]  # in launch order
        self._launched = self._inflight = None
        for launched in launches:
            self._ready += self.runner.finish(launched)

    def num_streams(self) -> int:
        return self.runner.num_streams()

    def capture(self, progress: Progress | None = None) -> None:
        self.runner.capture(progress)

    def stats(self) -> dict | None:
        return None

    def close(self) -> None:
        """The runner holds no thread and no process."""
