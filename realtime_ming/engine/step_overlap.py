"""How many talker steps the engine queues while the thinker's step is still running on its own GPUs.

The engine thread alternates: collect thinker step k, queue step k+1, route its text, run the talker, and back
to collect. The talker needs one step per ~0.1 s of audio whatever the thinker does, so with one talker step per
engine step a turn's audio takes as many engine steps as it has talker steps, each as long as the thinker's step
(at 32 streams on 2x H200 ~23 ms, a talker step ~10 ms of GPU). When the talker has GPUs of its own
(`engine.placement.talker_devices` apart from the thinker's), `StepOverlap` lets the talker queue several steps
back to back in one launch (`TalkerRunner.launch(steps)`: one host wait for all of them), as many as end before
the thinker's step does by recent durations: thinker steps like the one in flight (with or without a prefill
chunk, which reads every MoE expert), the talker's one-step launch-to-outputs time and its marginal step. At most
half a marginal step may run past the thinker's expected end (it only delays the thinker's next launch by that
much); a thinker step seen finished early lowers its estimate at once. With no thinker step in flight, or its
event already reached, one step.

Runs on the engine thread only. On CPU (no step events) it always says one step.
"""

from __future__ import annotations

import time

__all__ = ["StepOverlap", "overlap_steps"]

_SMOOTHING = 0.2  # weight of the newest duration in the running averages
_OVERRUN = 0.5  # the share of a marginal talker step that may run past the thinker step's expected end
_FIRST_GUESS = 0.6  # a marginal talker step's share of a one-step launch, until one was measured


def overlap_steps(cfg) -> int:
    """`engine.talker.steps_while_thinking` where every talker replica is on a device apart from the thinker's
    (more talker work beside the thinker's on its own GPU would slow the thinker's step), else 0."""
    talker = {device for device, _ in cfg.placement.talker_replicas}
    return 0 if talker & set(cfg.placement.thinker_devices) else cfg.talker.steps_while_thinking


def _average(known: float | None, seconds: float) -> float:
    return seconds if known is None else known + _SMOOTHING * (seconds - known)


class StepOverlap:
    def __init__(self, max_extra: int, thinker_delay: float = 0.0):
        self.max_extra = max(0, int(max_extra))
        self.thinker_delay = thinker_delay
        self._thinker_s: dict[bool, float] = {}  # with a prefill chunk? -> a thinker step's launch → done seconds
        self._one_s: float | None = None  # a one-step talker launch → its outputs delivered
        self._more_s: float | None = None  # each further step queued in the same launch
        self._launched: tuple[int, float, bool] | None = None  # the step in flight: (id, launch time, chunk)
        self.extra_steps = 0  # talker steps queued beyond one per launch, in total

    @property
    def enabled(self) -> bool:
        return self.max_extra > 0

    def launched(self, step) -> None:
        """A thinker step was queued (call right after `ThinkerRunner.launch`)."""
        if self.enabled and step is not None and step.ready is not None:
            self._launched = (id(step), time.perf_counter(), bool(step.chunk))

    def before_collect(self, step) -> bool:
        """Whether collecting `step` will wait for its GPUs (its event not reached yet)."""
        return self.enabled and step is not None and step.ready is not None and not step.ready.query()

    def collected(self, step, waited: bool) -> None:
        """`step` was collected; `waited`: `before_collect` said it was still running. A waited step's duration
        is exact; a step already done gives an upper bound, which can only lower the estimate."""
        if not self.enabled or step is None:
            return
        start = self._started(step)
        if start is None:
            return
        self._launched = None
        launched_at, chunk = start
        seconds = time.perf_counter() - launched_at
        known = self._thinker_s.get(chunk)
        if waited:
            self._thinker_s[chunk] = _average(known, seconds)
        elif known is not None and seconds < known:
            self._thinker_s[chunk] = seconds

    def talker_stepped(self, seconds: float, steps: int) -> None:
        """A talker launch of `steps` steps took `seconds` of the engine thread (launch, wait, outputs)."""
        if not self.enabled:
            return
        if steps <= 1:
            self._one_s = _average(self._one_s, seconds)
        elif self._one_s is not None:
            self._more_s = _average(self._more_s, max(0.0, seconds - self._one_s) / (steps - 1))
            self.extra_steps += steps - 1

    def _started(self, step) -> tuple[float, bool] | None:
        """(launch time, chunk) of `step` if it is the step in flight."""
        if self._launched is None or self._launched[0] != id(step):
            return None
        return self._launched[1:]

    def talker_steps(self, step) -> int:
        """How many talker steps to queue now while `step` (the thinker's step in flight, or None) runs."""
        if not self.enabled or step is None or step.ready is None or self._one_s is None:
            return 1
        start = self._started(step)
        expected = None if start is None else self._thinker_s.get(start[1])
        if expected is None or step.ready.query():
            return 1
        more = self._more_s if self._more_s is not None else _FIRST_GUESS * self._one_s
        end = time.perf_counter() - start[0] + self._one_s  # where one step would end, since the thinker's launch
        steps = 1
        limit = expected * (1.0 + self.thinker_delay) + _OVERRUN * more
        while steps <= self.max_extra and end + more <= limit:
            steps, end = steps + 1, end + more
        return steps
