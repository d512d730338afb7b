"""`StepOverlap`: when the engine runs one more talker step while the thinker's step is still on its GPUs.

The thinker step's event and the clock are fakes: the rule is about timing, and the GPU run of the engine with
the talker on GPUs of its own is in bench/engine_bench.py (`engine.talker.steps_while_thinking` 0 vs 2)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from realtime_ming.engine import step_overlap
from realtime_ming.engine.config import EngineConfig, PlacementConfig, TalkerRunnerConfig
from realtime_ming.engine.step_overlap import StepOverlap, overlap_steps


class _Event:
    def __init__(self):
        self.done = False

    def query(self) -> bool:
        return self.done


@dataclass
class _Step:
    chunk: bool = False
    ready: object = field(default_factory=_Event)


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr(step_overlap.time, "perf_counter", c)
    return c


def _run_step(overlap: StepOverlap, clock: _Clock, seconds: float, chunk: bool, waited: bool = True) -> None:
    """A thinker step launched, collected `seconds` later (waiting for it or not)."""
    step = _Step(chunk)
    overlap.launched(step)
    clock.t += seconds
    step.ready.done = not waited
    was_running = overlap.before_collect(step)
    assert was_running == waited
    step.ready.done = True
    overlap.collected(step, was_running)


def test_no_extra_step_without_estimates_or_when_off(clock):
    off = StepOverlap(0)
    step = _Step()
    off.launched(step)
    assert not off.enabled and not off.another_talker_step(step, 0)
    on = StepOverlap(2)
    on.launched(step)
    assert not on.another_talker_step(step, 0)  # neither durations known yet
    on.talker_stepped(0.010)
    assert not on.another_talker_step(step, 0)  # the thinker's not known yet


def test_a_long_thinker_step_fits_talker_steps_until_half_a_step_would_run_past(clock):
    overlap = StepOverlap(3)
    _run_step(overlap, clock, 0.035, chunk=True)  # a step with a prefill chunk: 35 ms
    _run_step(overlap, clock, 0.014, chunk=False)  # a decode-only step: 14 ms
    overlap.talker_stepped(0.012)
    step = _Step(chunk=True)
    overlap.launched(step)
    clock.t += 0.013  # the first talker step ran: 22 ms left, a talker step is 12
    assert overlap.another_talker_step(step, 0)
    clock.t += 0.012  # 10 ms left: 6 ms of the next talker step would run past -> still within half a step
    assert overlap.another_talker_step(step, 1)
    clock.t += 0.012  # past the expected end
    assert not overlap.another_talker_step(step, 2)
    assert not overlap.another_talker_step(step, 3)  # the cap anyway
    decode_only = _Step(chunk=False)
    overlap.launched(decode_only)
    clock.t += 0.013  # 1 ms left of a 14 ms step: no room
    assert not overlap.another_talker_step(decode_only, 0)


def test_a_finished_thinker_step_never_gets_another_talker_step(clock):
    overlap = StepOverlap(2)
    _run_step(overlap, clock, 0.040, chunk=False)
    overlap.talker_stepped(0.010)
    step = _Step()
    overlap.launched(step)
    clock.t += 0.005
    assert overlap.another_talker_step(step, 0)
    step.ready.done = True  # its event fired early
    assert not overlap.another_talker_step(step, 0)


def test_the_cap_bounds_the_extra_steps(clock):
    overlap = StepOverlap(1)
    _run_step(overlap, clock, 0.100, chunk=False)
    overlap.talker_stepped(0.010)
    step = _Step()
    overlap.launched(step)
    assert overlap.another_talker_step(step, 0)
    assert not overlap.another_talker_step(step, 1)


def test_a_step_seen_done_early_lowers_the_estimate_at_once(clock):
    overlap = StepOverlap(2)
    _run_step(overlap, clock, 0.040, chunk=False)  # measured 40 ms
    _run_step(overlap, clock, 0.015, chunk=False, waited=False)  # done within 15 ms: at most 15
    overlap.talker_stepped(0.010)
    step = _Step()
    overlap.launched(step)
    clock.t += 0.011  # 4 ms left of 15: the next talker step would run 6 past, more than half of 10
    assert not overlap.another_talker_step(step, 0)


def test_waited_durations_are_averaged_not_replaced(clock):
    overlap = StepOverlap(2)
    _run_step(overlap, clock, 0.040, chunk=False)
    _run_step(overlap, clock, 0.010, chunk=False)  # one short step: the estimate moves toward it, 40 -> 34 ms
    overlap.talker_stepped(0.010)
    step = _Step()
    overlap.launched(step)
    clock.t += 0.025
    assert overlap.another_talker_step(step, 0)  # 25 + 5 < 34
    clock.t += 0.005
    assert not overlap.another_talker_step(step, 0)  # 30 + 5 > 34


def test_a_step_without_an_event_cpu_never_overlaps(clock):
    overlap = StepOverlap(2)
    step = _Step(ready=None)
    overlap.launched(step)
    assert not overlap.before_collect(step)
    overlap.collected(step, False)
    overlap.talker_stepped(0.010)
    assert not overlap.another_talker_step(step, 0)


def test_config_rejects_a_negative_count_and_the_engine_only_overlaps_on_separate_gpus():
    with pytest.raises(ValueError, match="steps_while_thinking"):
        TalkerRunnerConfig(steps_while_thinking=-1)
    assert EngineConfig().talker.steps_while_thinking == 2

    def steps(**placement) -> int:
        return overlap_steps(EngineConfig(placement=PlacementConfig(**placement)))

    assert steps() == 0  # everything on the CPU
    assert steps(thinker_devices=("cuda:0", "cuda:1"), talker_devices=("cuda:2", "cuda:3")) == 2
    assert steps(thinker_devices=("cuda:0", "cuda:1"), talker_device="cuda:2", vae_device="cuda:2") == 2
    assert steps(thinker_devices=("cuda:0", "cuda:1"), talker_device="cuda:0", vae_device="cuda:0") == 0
    assert steps(thinker_devices=("cuda:0", "cuda:1"), talker_devices=("cuda:2", "cuda:1")) == 0
    cfg = EngineConfig(placement=PlacementConfig(thinker_devices=("cuda:0",), talker_devices=("cuda:1",)),
                       talker=TalkerRunnerConfig(steps_while_thinking=0))
    assert overlap_steps(cfg) == 0
