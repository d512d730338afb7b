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


def _overlap(clock, max_extra=2, thinker=None, one=0.012, more=None) -> StepOverlap:
    """An overlap that has seen thinker steps of `thinker` {chunk: seconds} and one-step talker launches of `one` s
    (and, with `more`, a two-step launch of one + more)."""
    overlap = StepOverlap(max_extra)
    for chunk, seconds in (thinker or {}).items():
        _run_step(overlap, clock, seconds, chunk)
    if one is not None:
        overlap.talker_stepped(one, 1)
    if more is not None:
        overlap.talker_stepped(one + more, 2)
    return overlap


def test_one_step_without_estimates_or_when_off(clock):
    off = StepOverlap(0)
    step = _Step()
    off.launched(step)
    assert not off.enabled and off.talker_steps(step) == 1
    on = StepOverlap(2)
    on.launched(step)
    assert on.talker_steps(step) == 1  # neither duration known yet
    on.talker_stepped(0.010, 1)
    assert on.talker_steps(step) == 1  # the thinker's not known yet
    assert _overlap(clock, thinker={False: 0.05}).talker_steps(None) == 1  # no thinker step in flight


def test_as_many_steps_as_end_before_the_thinker_step_half_a_step_of_overrun_allowed(clock):
    overlap = _overlap(clock, max_extra=3, thinker={True: 0.035, False: 0.014}, one=0.012, more=0.008)
    with_chunk = _Step(chunk=True)
    overlap.launched(with_chunk)
    clock.t += 0.002  # routing: one step ends at 14 ms, +8 each: 22, 30, 38 (35 + 4 allowed)
    assert overlap.talker_steps(with_chunk) == 4
    clock.t += 0.004  # 6 ms: 18, 26, 34, 42 -> three more would end at 42 > 39
    assert overlap.talker_steps(with_chunk) == 3
    decode_only = _Step(chunk=False)
    overlap.launched(decode_only)
    clock.t += 0.002  # one step ends at 14 = the thinker's 14: a second would end at 22 > 18
    assert overlap.talker_steps(decode_only) == 1


def test_the_cap_bounds_the_steps(clock):
    overlap = _overlap(clock, max_extra=1, thinker={False: 0.5}, one=0.010, more=0.008)
    step = _Step()
    overlap.launched(step)
    assert overlap.talker_steps(step) == 2


def test_a_finished_thinker_step_gets_one_talker_step(clock):
    overlap = _overlap(clock, thinker={False: 0.040}, one=0.010, more=0.008)
    step = _Step()
    overlap.launched(step)
    assert overlap.talker_steps(step) == 3
    step.ready.done = True  # its event fired early
    assert overlap.talker_steps(step) == 1


def test_a_marginal_step_is_guessed_until_measured_then_learned(clock):
    overlap = _overlap(clock, thinker={False: 0.030}, one=0.015)
    step = _Step()
    overlap.launched(step)
    assert overlap.talker_steps(step) == 3  # guess 0.6 x 15 = 9 ms: 24 and 33 <= 30 + 4.5
    overlap.talker_stepped(0.015 + 0.032, 2)  # measured: a further step costs 32 ms here
    assert overlap.talker_steps(step) == 1  # 15 + 32 = 47 > 30 + 16
    assert overlap.extra_steps == 1


def test_a_step_seen_done_early_lowers_the_estimate_at_once(clock):
    overlap = _overlap(clock, thinker={False: 0.040}, one=0.012, more=0.008)
    _run_step(overlap, clock, 0.015, chunk=False, waited=False)  # done within 15 ms: at most 15
    step = _Step()
    overlap.launched(step)
    assert overlap.talker_steps(step) == 1  # 12 + 8 = 20 > 15 + 4


def test_waited_durations_are_averaged_not_replaced(clock):
    overlap = _overlap(clock, max_extra=8, thinker={False: 0.040}, one=0.010, more=0.004)
    _run_step(overlap, clock, 0.010, chunk=False)  # one short step: the estimate moves toward it, 40 -> 34 ms
    step = _Step()
    overlap.launched(step)
    assert overlap.talker_steps(step) == 7  # 10 + 6 x 4 = 34 <= 36; 38 > 36


def test_a_step_without_an_event_cpu_never_overlaps(clock):
    overlap = StepOverlap(2)
    step = _Step(ready=None)
    overlap.launched(step)
    assert not overlap.before_collect(step)
    overlap.collected(step, False)
    overlap.talker_stepped(0.010, 1)
    assert overlap.talker_steps(step) == 1


def test_config_rejects_bad_values_and_the_engine_only_overlaps_on_separate_gpus():
    with pytest.raises(ValueError, match="steps_while_thinking"):
        TalkerRunnerConfig(steps_while_thinking=-1)
    with pytest.raises(ValueError, match="thinker_delay"):
        TalkerRunnerConfig(thinker_delay=-0.1)
    assert EngineConfig().talker.steps_while_thinking == 0  # off by default: it trades TTFA at load for throughput
    on = TalkerRunnerConfig(steps_while_thinking=2)

    def steps(**placement) -> int:
        return overlap_steps(EngineConfig(placement=PlacementConfig(**placement), talker=on))

    assert steps() == 0  # everything on the CPU
    assert steps(thinker_devices=("cuda:0", "cuda:1"), talker_devices=("cuda:2", "cuda:3")) == 2
    assert steps(thinker_devices=("cuda:0", "cuda:1"), talker_device="cuda:2", vae_device="cuda:2") == 2
    assert steps(thinker_devices=("cuda:0", "cuda:1"), talker_device="cuda:0", vae_device="cuda:0") == 0
    assert steps(thinker_devices=("cuda:0", "cuda:1"), talker_devices=("cuda:2", "cuda:1")) == 0
    off = EngineConfig(placement=PlacementConfig(thinker_devices=("cuda:0",), talker_devices=("cuda:1",)))
    assert overlap_steps(off) == 0
