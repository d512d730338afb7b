"""`engine.talker.driver: process`: each talker replica's loop runs in a process of its own
(`engine/talker_process.py`). The client gets the same text and audio as from the talker stepped inline once per
engine step (the child adopts the parent's weights), with several steps per launch and pipelined too; voices reach
the child; cancels and speculation keep their guarantees; a failing talker step fails its turns only; a child that
dies kills the engine at once (every turn fails, health reports it); close stops every child."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import numpy as np
import pytest

from realtime_ming.engine import Engine
from realtime_ming.engine.api import AudioChunk, FailureCode, TurnDone, TurnFailed
from realtime_ming.engine.config import PlacementConfig, TalkerRunnerConfig
from realtime_ming.engine.models import ModelBundle
from realtime_ming.engine.talker_driver import Enqueue
from realtime_ming.engine.talker_inline import InlineTalker
from realtime_ming.engine.talker_loop import TalkerLoop
from realtime_ming.engine.talker_pool import TalkerPool
from realtime_ming.engine.talker_process import ProcessTalker
from realtime_ming.engine.talker_runner import TalkerRunner
from realtime_ming.engine.voice_store import CustomVoice
from engine_support import (  # noqa: F401 - bundle, engines: shared fixtures
    _assert_same_output, bundle, _cancel_waves, _config, _done_fields, engines, _pcm_by_segment, PROMPT_A,
    PROMPT_B, Recorder, _request, _run, _wait_stats,
)

pytestmark = pytest.mark.timeout(300)


def _in_process(fixture_root, pipeline: bool = False, steps_per_launch: int = 1, **engine):
    cfg = _config(fixture_root, engine or None)
    return dataclasses.replace(cfg, talker=dataclasses.replace(
        cfg.talker, driver="process", steps_per_launch=steps_per_launch, pipeline=pipeline))


def _assert_same_speech(a: list[Recorder], b: list[Recorder]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.text() == y.text() and x.events[-1].audio_samples > 0
        assert _done_fields(x.events[-1]) == _done_fields(y.events[-1])
        assert x.events[-1].talker_steps == y.events[-1].talker_steps
        px, py = _pcm_by_segment(x), _pcm_by_segment(y)
        assert px.keys() == py.keys()
        for seg in px:  # batched differently: equal within float noise
            np.testing.assert_allclose(px[seg], py[seg], rtol=0, atol=1e-4)


def _speak(engine: Engine, tag: str, voice: str | None = None) -> list[Recorder]:
    make = [_request(f"a{tag}", PROMPT_A, seed=1), _request(f"b{tag}", PROMPT_B, seed=5, temperature=0.8),
            _request(f"c{tag}", PROMPT_B, seed=2, max_tokens=20)]
    recs = [Recorder() for _ in make]
    for request, rec in zip(make, recs):
        if voice is not None:
            request = dataclasses.replace(request, voice=voice)
        engine.submit(request, rec)
    for rec in recs:
        assert isinstance(rec.wait(), TurnDone), rec.events[-1]
    return recs


@pytest.mark.parametrize("steps_per_launch,pipeline", [
    (1, False), pytest.param(2, True, marks=pytest.mark.slow), pytest.param(3, False, marks=pytest.mark.slow),
    pytest.param(1, True, marks=pytest.mark.slow)])
def test_talker_process_speaks_what_the_stepped_talker_speaks(fixture_root, bundle, engines, steps_per_launch,
                                                              pipeline):
    """Three turns at once (greedy and sampled): the same text, usage, talker steps and audio per segment from the
    talker in its own process as from the talker stepped inline with the thinker, in every preset voice -- also with
    several talker steps queued per launch (`steps_per_launch`: streams that end between keep nothing of the steps
    after) and pipelined (the next launch queued before the last one is read: rows move between launch and
    finish)."""
    stepped = Engine(_config(fixture_root), bundle)
    engines.append(stepped)
    assert isinstance(stepped._talker, InlineTalker)
    child = Engine(_in_process(fixture_root, pipeline, steps_per_launch), bundle)
    engines.append(child)
    assert isinstance(child._talker, ProcessTalker) and child._talker.pid != os.getpid()
    for voice in [None, *sorted(bundle.voices)]:
        tag = f"-{voice}"
        _assert_same_speech(_speak(stepped, "s" + tag, voice), _speak(child, "p" + tag, voice))
    _wait_stats(child, lambda s: (s.turns, s.thinker_rows, s.talker_streams) == (0, 0, 0))


@pytest.mark.slow
def test_talker_processes_on_two_replicas(fixture_root, engines):
    """Two replicas, each in its own process, each adopting the parent's copy of the weights: turns go to both and
    speak what one stepped replica speaks."""
    cfg = _config(fixture_root)
    two = dataclasses.replace(cfg, placement=PlacementConfig(talker_devices=["cpu", "cpu"]))
    pool_bundle = ModelBundle.load(two)
    stepped = Engine(cfg, pool_bundle)
    engines.append(stepped)
    child = Engine(dataclasses.replace(_in_process(fixture_root), placement=two.placement), pool_bundle)
    engines.append(child)
    pool = child._talker
    assert isinstance(pool, TalkerPool) and all(isinstance(m, ProcessTalker) for m in pool.members)
    assert len({m.pid for m in pool.members}) == 2
    recs = _speak(child, "p")
    _assert_same_speech(_speak(stepped, "s"), recs)


@pytest.mark.slow
def test_a_cloned_voice_reaches_the_talker_process(fixture_root, bundle, engines):
    """A voice registered at run time (a `CustomVoice`) is sent to the child at its first use and spoken there as
    the stepped talker speaks it."""
    encoder = bundle.voice_encoder
    rng = np.random.default_rng(3)
    wave = (rng.standard_normal(encoder.vae_rate_hz * 2) * 0.1).astype(np.float32)
    prompt = encoder.encode(wave, encoder.vae_rate_hz, "Hello.", lambda w, a, b: w)
    voice = CustomVoice("voice_proc", "owner", "proc", prompt, "Hello.", 2.0, 0)
    stepped = Engine(_config(fixture_root), bundle)
    child = Engine(_in_process(fixture_root), bundle)
    engines += [stepped, child]
    a = _run(stepped, dataclasses.replace(_request("vs", PROMPT_A, seed=1), voice=voice))
    b = _run(child, dataclasses.replace(_request("vp", PROMPT_A, seed=1), voice=voice))
    _assert_same_speech([a], [b])


@pytest.mark.slow
def test_a_talker_process_that_dies_kills_the_engine_at_once(fixture_root, bundle):
    """SIGKILL the child mid-turn: the turn in flight fails as engine unavailable within a second, health reports
    the dead talker, later turns are refused; close returns."""
    engine = Engine(_in_process(fixture_root), bundle)
    try:
        rec = Recorder()
        engine.submit(_request("k", PROMPT_A, seed=1), rec)
        deadline = time.monotonic() + 60
        while not any(isinstance(e, AudioChunk) for e in rec.events):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(engine._talker.pid, signal.SIGKILL)
        end = rec.wait()
        if isinstance(end, TurnFailed):
            assert end.code is FailureCode.ENGINE_UNAVAILABLE and "talker process 0 exited" in end.message
        engine.cancel("k")  # calls that reach the dead child's pipe raise nothing
        engine.discard("k")
        health = engine.health()
        assert not health.alive and "talker process 0 exited" in health.reason
        late = _run(engine, _request("late", PROMPT_B, seed=1))
        assert isinstance(late.events[-1], TurnFailed) and late.events[-1].code is FailureCode.ENGINE_UNAVAILABLE
    finally:
        engine.close()
        assert not engine._thread.is_alive()  # the dead engine's thread ended (it was idle on its inbox)


@pytest.mark.slow
def test_close_stops_every_talker_process(fixture_root, bundle):
    engine = Engine(_in_process(fixture_root, pipeline=True), bundle)
    _run(engine, _request("x", PROMPT_B, seed=1))
    proc = engine._talker._proc
    engine.close()
    assert not proc.is_alive() and proc.exitcode == 0


def test_the_driver_setting_and_the_process_driver_options():
    assert TalkerRunnerConfig().driver == "inline"
    with pytest.raises(ValueError, match="driver must be one of"):
        TalkerRunnerConfig(driver="thread")
    with pytest.raises(ValueError, match="needs engine.talker.driver: process"):
        TalkerRunnerConfig(steps_per_launch=2)
    TalkerRunnerConfig(driver="process", steps_per_launch=2)
    for driver in ("inline", "process"):  # pipelined either way (inline: tests/test_talker_inline_pipeline.py)
        assert TalkerRunnerConfig(driver=driver, pipeline=True).pipeline
    for bad in (0, 9):
        with pytest.raises(ValueError, match="steps_per_launch"):
            TalkerRunnerConfig(driver="process", steps_per_launch=bad)


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", [False, True])
def test_talker_process_cancel_ends_every_turn_cleanly_and_leaks_nothing(fixture_root, bundle, engines, pipeline):
    """30 turns cancelled at every stage: the terminal event is the last, nothing is left running, later turns
    are unchanged (pipelined too: a cancel finishes the launch in flight first)."""
    engine = Engine(_in_process(fixture_root, pipeline=pipeline), bundle)
    engines.append(engine)
    reference = _run(engine, _request("ref", PROMPT_A, seed=4))
    hooks = _cancel_waves(engine, len(reference.events))
    for hook in hooks:  # the talker process's PCM stops at the cancel call, not at the engine's next step
        assert sum(isinstance(e, AudioChunk) for e in hook.late[:-1]) <= 1
    _wait_stats(engine, lambda s: (s.turns, s.thinker_rows, s.talker_streams) == (0, 0, 0))
    after = _run(engine, _request("after", PROMPT_A, seed=4))
    _assert_same_output(reference, after)


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", [False, True])
def test_talker_process_confirmed_speculative_turn_equals_normal_turn(fixture_root, bundle, engines, pipeline):
    engine = Engine(_in_process(fixture_root, pipeline=pipeline, speculation_lookahead_ms=60_000.0), bundle)
    engines.append(engine)
    normal = _run(engine, _request("n", PROMPT_A, seed=3))
    live = Recorder()
    engine.submit(_request("s1", PROMPT_A, seed=3, speculative=True), live)
    _wait_stats(engine, lambda s: s.talker_streams == 1)
    assert live.events == []
    engine.confirm("s1")
    live.wait()
    _assert_same_output(normal, live)


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_failing_loop_step_fails_its_turns_and_the_loop_goes_on(bundle, pipeline):
    """The talker process's loop, here on a thread of this process: a step that raises reports its turns as failed
    (`error` set) and cancels their talker work; the next turn speaks as before; close stops the loop's thread."""
    from realtime_ming.engine.config import EngineConfig

    runner = TalkerRunner(bundle, EngineConfig(talker=TalkerRunnerConfig(max_prompt_len=1024)))
    launch, calls = runner.launch, []

    def flaky(steps=1, keep=False):
        calls.append(steps)
        if len(calls) == 3:
            raise RuntimeError("injected talker fault")
        return launch(steps, keep)

    runner.launch = flaky
    delivered, notices, died = [], [], []
    idle = threading.Event()

    def notify(events):
        notices.extend(events)
        if any(getattr(e, "turn_id", None) == "ok" and not hasattr(e, "error") for e in events):
            idle.set()

    loop = TalkerLoop(runner, delivered.extend, notify, died.append, pipeline=pipeline)
    try:
        loop.submit(Enqueue("f", 0, "One two three four five six.", None, 4))
        deadline = time.monotonic() + 60
        while not any(getattr(e, "error", None) for e in notices):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        failed = [e for e in notices if getattr(e, "error", None)]
        assert [e.turn_id for e in failed] == ["f"] and "injected talker fault" in failed[0].error
        assert not runner.pending("f")
        loop.submit(Enqueue("ok", 0, "Seven eight.", None, 4))
        assert idle.wait(60)
        assert any(o.turn_id == "ok" and o.pcm is not None and o.pcm.size for o in delivered) and died == []
    finally:
        loop.close()
    assert not loop._thread.is_alive()


_ORPHAN_SCRIPT = """
import sys
from realtime_ming.engine import Engine
from realtime_ming.engine.config import EngineConfig, TalkerRunnerConfig
from realtime_ming.engine.models import ModelBundle
cfg = EngineConfig(talker=TalkerRunnerConfig(driver="process"))
engine = Engine(cfg, ModelBundle.load(cfg))
print(engine._talker.pid, flush=True)
sys.stdin.read()
"""


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_talker_process_outlives_no_killed_server():
    """SIGKILL the serving process (no close, no atexit): its talker process sees the pipe close and exits."""
    import subprocess
    import sys

    server = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        child = int(server.stdout.readline())
        assert _running(child)
        server.kill()
        server.wait(10)
        deadline = time.monotonic() + 15
        while _running(child):
            assert time.monotonic() < deadline, "the talker process outlived its server"
            time.sleep(0.1)
    finally:
        server.kill()


@pytest.mark.slow
def test_a_talker_process_that_cannot_start_is_reported(fixture_root, bundle):
    """A child that fails to build its replica (here: tensors that do not fit the talker) reports why, and the
    parent raises at once instead of serving without a talker."""
    from realtime_ming.engine.talker_replica import TalkerReplica

    first = bundle.talker_replicas[0]
    wrong = TalkerReplica(0, first.vae, first.vae, first.device, first.vae_device)  # the VAE's tensors as the talker's
    with pytest.raises(RuntimeError, match="talker process 0 did not start: .*state_dict"):
        ProcessTalker(bundle, _in_process(fixture_root), wrong, lambda outputs: None, lambda: None,
                      lambda reason: None)


def test_a_talker_process_on_a_thinker_gpu_is_warned(caplog):
    """Only a CUDA device shared with the thinker is warned about (CPU placements and talker GPUs apart are not)."""
    import torch

    from realtime_ming.engine.config import EngineConfig
    from realtime_ming.engine.talker_process import warn_shared_gpus
    from realtime_ming.engine.talker_replica import TalkerReplica

    def bundle_on(*devices):
        replicas = [TalkerReplica(i, None, None, torch.device(d), torch.device(d)) for i, d in enumerate(devices)]
        return type("B", (), {"talker_replicas": replicas})()

    def cfg(*thinker):
        return EngineConfig(placement=PlacementConfig(thinker_devices=thinker, encoder_device="cpu"))

    with caplog.at_level("WARNING", logger="realtime_ming.engine.talker_process"):
        warn_shared_gpus(bundle_on("cuda:2", "cuda:3"), cfg("cuda:0", "cuda:1"))
        warn_shared_gpus(bundle_on("cpu"), cfg("cpu"))
        assert caplog.records == []
        warn_shared_gpus(bundle_on("cuda:1", "cuda:2"), cfg("cuda:0", "cuda:1"))
    assert len(caplog.records) == 1 and "on cuda:1, a thinker GPU" in caplog.records[0].getMessage()


@pytest.mark.slow
def test_the_talker_loops_report_their_time_and_work(fixture_root, bundle, engines):
    """`stats` (the benchmarks' view of a talker process's loop): the child answers with the same totals of jobs
    started and rows stepped as the inline runner's for the same turns -- every talker step the turns report -- and
    with the time it spent launching, finishing and idle."""
    inline = Engine(_config(fixture_root), bundle)
    child = Engine(_in_process(fixture_root), bundle)
    engines += [inline, child]
    assert inline._talker.stats() is None
    totals = []
    for engine, tag in ((inline, "i"), (child, "p")):
        recs = _speak(engine, "stats-" + tag)
        _wait_stats(engine, lambda s: s.talker_streams == 0)
        stats = engine._talker.stats() or engine._talker.runner.counts
        assert stats["rows"] == sum(r.events[-1].talker_steps for r in recs)
        assert stats["jobs"] >= len(recs) and stats["steps"] >= 1
        totals.append((stats["jobs"], stats["rows"]))
    stats = child._talker.stats()
    assert stats["launches"] >= stats["steps"] // 2
    assert all(stats[k] > 0 for k in ("launch_s", "finish_s", "idle_s", "admit_s"))
    assert totals[0] == totals[1]
