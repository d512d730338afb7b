"""Extra talker steps while the thinker's step is still running on its own GPUs.

The engine thread alternates: collect thinker step k, queue step k+1, route its text, run one talker step, and
back to collect. When the talker has GPUs of its own (`engine.placement.talker_devices` apart from the thinker's)
and the thinker's step is the longer one (a prefill chunk reads every MoE expert: a step with one takes about
twice a decode-only step), the thread would sit in `collect` while the talker's GPUs idle. `StepOverlap` says
when one more talker step fits before the thinker's step ends: the step in flight has not signalled its event,
and, by the recent durations of thinker steps like it (with or without a prefill chunk) and of talker steps, at
most half a talker step would run past the thinker's end. A talker step that runs past it only delays the
thinker's next launch by that much; the estimates are recent exponential averages, lowered at once by a thinker
step seen finished early.

Runs on the engine thread only. On CPU (no step events) it never asks for an extra step.
"""

from __future__ import annotations

import time

__all__ = ["StepOverlap", "overlap_steps"]

_SMOOTHING = 0.2  # weight of the newest duration in the running averages
_OVERRUN = 0.5  # the share of a talker step that may run past the thinker step's expected end


def overlap_steps(cfg) -> int:
    """`engine.talker.steps_while_thinking` where every talker replica is on a device apart from the thinker's
    (a talker step beside the thinker's on its own GPU would slow the thinker's step), else 0."""
    talker = {device for device, _ in cfg.placement.talker_replicas}
    return 0 if talker & set(cfg.placement.thinker_devices) else cfg.talker.steps_while_thinking


class StepOverlap:
    def __init__(self, max_extra: int):
        self.max_extra = max(0, int(max_extra))
        self._thinker_s: dict[bool, float] = {}  # with a prefill chunk? -> a thinker step's launch → done seconds
        self._talker_s: float | None = None
        self._launched_at: dict[int, tuple[float, bool]] = {}  # id(launched step) -> (launch time, chunk)
        self.extra_steps = 0  # talker steps run while a thinker step was in flight (beyond the first), in total

    @property
    def enabled(self) -> bool:
        return self.max_extra > 0

    def launched(self, step) -> None:
        """A thinker step was queued (call right after `ThinkerRunner.launch`)."""
        if self.enabled and step is not None and step.ready is not None:
            self._launched_at = {id(step): (time.perf_counter(), bool(step.chunk))}

    def before_collect(self, step) -> bool:
        """Whether collecting `step` will wait for its GPUs (its event not reached yet)."""
        return self.enabled and step is not None and step.ready is not None and not step.ready.query()

    def collected(self, step, waited: bool) -> None:
        """`step` was collected; `waited`: `before_collect` said it was still running. A waited step's duration
        is exact; a step already done gives an upper bound, which can only lower the estimate."""
        if not self.enabled or step is None:
            return
        start = self._launched_at.pop(id(step), None)
        if start is None:
            return
        launched_at, chunk = start
        seconds = time.perf_counter() - launched_at
        known = self._thinker_s.get(chunk)
        if waited:
            self._thinker_s[chunk] = seconds if known is None else known + _SMOOTHING * (seconds - known)
        elif known is not None and seconds < known:
            self._thinker_s[chunk] = seconds

    def talker_stepped(self, seconds: float) -> None:
        """One talker step (launch, wait, outputs handled) took `seconds` of the engine thread."""
        if self.enabled:
            known = self._talker_s
            self._talker_s = seconds if known is None else known + _SMOOTHING * (seconds - known)

    def another_talker_step(self, step, extra: int) -> bool:
        """Whether to run one more talker step now, `extra` having run already while `step` is in flight."""
        if not self.enabled or extra >= self.max_extra or step is None or step.ready is None:
            return False
        start = self._launched_at.get(id(step))
        if start is None or self._talker_s is None or step.ready.query():
            return False
        expected = self._thinker_s.get(start[1])
        if expected is None:
            return False
        elapsed = time.perf_counter() - start[0]
        return elapsed + _OVERRUN * self._talker_s < expected
