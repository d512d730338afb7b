"""The inline talker driver (`engine.talker.driver: inline`, the default): the engine thread steps the talker.

Once per engine step the engine `launch`es the talker's step right after queuing the thinker's next one (its own
CUDA streams, so both run side by side) and waits for it in `outputs` (stop decisions, VAE, PCM): text routed to
the talker in one engine step is spoken from that same step. Ops are applied to the runner at once (the engine
thread is between steps whenever it sends one); PCM is delivered by the engine thread, so `drop` has nothing to do.
"""

from __future__ import annotations

from .talker_driver import Enqueue, Forget, Pause, Resume, TalkerOp, apply_op
from .talker_runner import TalkerOutput, TalkerRunner
from .talker_step import Progress

__all__ = ["InlineTalker"]


class InlineTalker:
    """A `TalkerDriver` over one replica's `TalkerRunner`, stepped by the engine thread (engine thread only)."""

    def __init__(self, runner: TalkerRunner):
        self.runner = runner
        self._launched = None  # the step `launch` queued, collected by `outputs`

    @property
    def replica(self):
        return self.runner.replica

    def _apply(self, op: TalkerOp) -> None:
        apply_op(self.runner, op)

    def enqueue(self, op: Enqueue) -> None:
        self._apply(op)

    def pause(self, turn_id: str) -> None:
        self._apply(Pause(turn_id))

    def resume(self, turn_id: str) -> None:
        self._apply(Resume(turn_id))

    def forget(self, turn_id: str) -> None:
        self._apply(Forget(turn_id))

    def drop(self, turn_id: str) -> None:
        """Nothing to do: only the engine thread delivers this talker's output, after applying the cancel."""

    def pending(self, turn_id: str) -> bool:
        return self.runner.pending(turn_id)

    def has_work(self) -> bool:
        return self.runner.has_work()

    def launch(self) -> None:
        self._launched = self.runner.launch()

    def outputs(self) -> list[TalkerOutput]:
        launched, self._launched = self._launched, None
        return [] if launched is None else self.runner.finish(launched)

    def num_streams(self) -> int:
        return self.runner.num_streams()

    def capture(self, progress: Progress | None = None) -> None:
        self.runner.capture(progress)

    def stats(self) -> dict | None:
        return None

    def close(self) -> None:
        """The runner holds no thread and no process."""
