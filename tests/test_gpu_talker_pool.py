"""Talker data parallelism on two GPUs (`engine.placement.talker_devices: [cuda:0, cuda:1]`, CUDA graphs on):
every turn's PCM through the pool equals the single graphed runner's on cuda:0 (a cloned voice registered on
cuda:0 and copied to cuda:1 included), and the two replicas' steps overlap: at the full-size talker's shapes
(dummy bf16 weights) the pool's step over 2 x 16 streams takes well under two single-replica 16-stream steps."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict

import numpy as np
import pytest
import torch

from realtime_ming.engine.config import EngineConfig, PlacementConfig, TalkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.talker_driver import Enqueue
from realtime_ming.engine.talker_inline import InlineTalker
from realtime_ming.engine.talker_pool import TalkerPool, make_talker
from realtime_ming.engine.talker_process import ProcessTalker
from realtime_ming.engine.talker_runner import TalkerRunner
from realtime_ming.engine.voice_store import CustomVoice

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]

TWO = PlacementConfig(thinker_devices=("cpu",), encoder_device="cpu", talker_devices=("cuda:0", "cuda:1"))
WORDS = (4, 7, 5, 6, 3, 8)  # words per turn: turn k joins at step k (streams end at different steps)


@pytest.fixture(scope="module")
def gpu_bundle():
    from realtime_ming.engine.models import ModelBundle

    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield ModelBundle.load(EngineConfig(dtype="float32", placement=TWO), hooks=EngineHooks(steps_per_word=2))
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def _cfg(max_streams: int = 8) -> EngineConfig:
    return EngineConfig(enforce_eager=False, talker=TalkerRunnerConfig(
        max_streams=max_streams, buckets=(1, 2, 4, 8, 16), silence_holder=False))


def _pool(bundle, cfg: EngineConfig, deliver=lambda outputs: None, wake=lambda: None, die=lambda reason: None):
    """The engine's talker over both replicas (`engine.talker.driver` as `cfg` says)."""
    pool = make_talker(bundle, cfg, deliver, wake, die)
    assert isinstance(pool, TalkerPool)
    return pool


def _step(talker) -> list:
    talker.launch()
    return talker.outputs()


def _drive(talker, voices) -> dict[str, np.ndarray]:
    pcm, step = defaultdict(list), 0
    while step < len(WORDS) or talker.has_work():
        if step < len(WORDS):
            talker.enqueue(Enqueue(f"t{step}", 0, " ".join(["word"] * WORDS[step]), voices[step % len(voices)],
                                   100 + step))
        for out in _step(talker):
            assert out.error is None, out.error
            if out.pcm is not None:
                pcm[out.turn_id].append(out.pcm)
        step += 1
    return {t: np.concatenate(c) for t, c in pcm.items()}


def test_replicas_on_two_gpus_hold_the_same_tensors(gpu_bundle):
    first, second = gpu_bundle.talker_replicas
    assert gpu_bundle.info()["talker_devices"] == ["cuda:0", "cuda:1"]
    for a, b in ((first.talker, second.talker), (first.vae, second.vae)):
        sa, sb = a.state_dict(), b.state_dict()
        for name in sa:
            assert sb[name].device == torch.device("cuda", 1), name
            assert torch.equal(sa[name].cpu(), sb[name].cpu()), name


def test_graphed_pool_on_two_gpus_speaks_as_the_single_runner(gpu_bundle):
    enc = gpu_bundle.voice_encoder
    wave = torch.from_numpy(np.random.default_rng(2).standard_normal(2 * enc.vae_rate_hz).astype(np.float32) * 0.1)
    clone = CustomVoice("voice_gpu", "owner", "gpu", enc.encode(wave, enc.vae_rate_hz, "Hello.", lambda w, a, b: w),
                        "Hello.", 2.0, 0)
    assert clone.prompt.prompt_lat.device == torch.device("cuda", 0)
    voices = (None, clone)
    single = InlineTalker(TalkerRunner(gpu_bundle, _cfg()))
    single.capture()
    want = _drive(single, voices)
    pool = _pool(gpu_bundle, _cfg())
    pool.capture()
    assert all(m.runner.stepper.graphed for m in pool.members)
    got = _drive(pool, voices)
    assert {pool.replica_of(f"t{k}") for k in range(len(WORDS))} == {0, 1}
    copies = pool.members[1].replica.voices
    assert len(copies) >= 2  # the preset and the clone, copied to cuda:1
    assert sorted(got) == sorted(want)
    for turn in want:
        assert got[turn].shape == want[turn].shape, turn
        peak = float(np.abs(want[turn]).max())
        assert peak > 0, turn
        np.testing.assert_allclose(got[turn], want[turn], rtol=0, atol=1e-3 * peak, err_msg=turn)


@pytest.mark.parametrize("steps,pipeline", [(1, False), (1, True), (2, True)])
def test_graphed_pool_with_a_process_per_gpu_speaks_as_the_single_runner(gpu_bundle, steps, pipeline):
    """`engine.talker.driver: process` on two GPUs: each replica's child adopts the parent's weights through CUDA IPC
    and captures and steps its graphs in a process of its own; every turn (spread over both) has the single graphed
    runner's PCM -- also pipelined (`engine.talker.pipeline`: the next launch replays the graphs before the last one
    is read) and with several steps per launch (`engine.talker.steps_per_launch`)."""
    single = InlineTalker(TalkerRunner(gpu_bundle, _cfg()))
    single.capture()
    want = _drive(single, (None,))
    pcm, woken, died = defaultdict(list), threading.Event(), []

    def deliver(outputs):
        for out in outputs:
            if out.pcm is not None:
                pcm[out.turn_id].append(out.pcm)

    cfg = _cfg()
    cfg = dataclasses.replace(cfg, talker=dataclasses.replace(cfg.talker, driver="process", steps_per_launch=steps,
                                                              pipeline=pipeline))
    pool = _pool(gpu_bundle, cfg, deliver, woken.set, died.append)
    try:
        pool.capture()
        assert all(isinstance(m, ProcessTalker) for m in pool.members)
        assert len({member.pid for member in pool.members}) == 2
        turns = [f"t{k}" for k in range(len(WORDS))]
        for k, turn in enumerate(turns):
            pool.enqueue(Enqueue(turn, 0, " ".join(["word"] * WORDS[k]), None, 100 + k))
        assert {pool.replica_of(t) for t in turns} == {0, 1}
        deadline = time.monotonic() + 120
        while any(pool.pending(t) for t in turns):  # this thread plays the engine thread: it takes the notices
            assert woken.wait(max(0.1, deadline - time.monotonic()))
            woken.clear()
            assert pool.outputs() == []  # no failed turn
        assert died == []
    finally:
        pool.close()
    got = {t: np.concatenate(c) for t, c in pcm.items()}
    assert sorted(got) == sorted(want)
    for turn in want:
        peak = float(np.abs(want[turn]).max())
        assert got[turn].shape == want[turn].shape and peak > 0, turn
        np.testing.assert_allclose(got[turn], want[turn], rtol=0, atol=1e-3 * peak, err_msg=turn)


def _full_size(bundle):
    """`bundle` with the full-size Ming talker and AudioVAE (dummy bf16 weights, the same on both GPUs) on its
    two replicas, voices without a prompt: the talker's real step cost, without loading the thinker."""
    from realtime_ming.engine.models import _build, _replicate
    from realtime_ming.engine.talker_replica import TalkerReplica
    from realtime_ming.model.kernels import TRITON
    from realtime_ming.model.presets import preset_config
    from realtime_ming.model.talker import Talker
    from realtime_ming.model.vae import AudioVAE

    full, dtype = preset_config("ming-flash-omni-2.0"), torch.bfloat16
    common = dict(dtype=dtype, kernels=TRITON)
    talker = _build(Talker, full.talker, device="cuda:0", what="talker", seed=0, **common)
    vae = _build(AudioVAE, full.vae, device="cuda:0", what="vae", seed=0, **common)
    one = torch.device("cuda", 1)
    replicas = [TalkerReplica(0, talker, vae, torch.device("cuda", 0), torch.device("cuda", 0)),
                TalkerReplica(1, _replicate(talker, Talker, full.talker, device=one, **common),
                              _replicate(vae, AudioVAE, full.vae, device=one, **common), one, one)]
    big = dataclasses.replace(bundle, cfg=dataclasses.replace(bundle.cfg, talker=full.talker, vae=full.vae),
                              dtype=dtype, talker=talker, vae=vae, talker_replicas=replicas, voices={})
    big.set_preset_voice(bundle.default_voice, "", None)
    return big


def _step_ms(talker, turns: int, steps: int = 12) -> float:
    """Median wall ms of `talker`'s step (an inline driver or pool) with `turns` streams running (each speaks long
    enough)."""
    for k in range(turns):
        talker.enqueue(Enqueue(f"s{k}", 0, " ".join(["word"] * 40), None, k))
    for _ in range(3):  # admission, the leads' double step, warm
        _step(talker)
    assert talker.num_streams() == turns
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        _step(talker)
        times.append(1000 * (time.perf_counter() - t0))
    assert talker.num_streams() == turns
    return float(np.median(times))


def test_two_replicas_step_side_by_side(gpu_bundle):
    big = _full_size(gpu_bundle).with_hooks(EngineHooks(steps_per_word=8))
    cfg = _cfg(max_streams=16)
    single = InlineTalker(TalkerRunner(big, cfg))
    single.capture()
    pool = _pool(big, cfg)
    pool.capture()
    one = _step_ms(single, 16)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    with torch.cuda.device(0):
        ev[0].record(single.runner.cuda_stream)
        _step(single)
        ev[1].record(single.runner.cuda_stream)
    ev[1].synchronize()
    gpu_one = ev[0].elapsed_time(ev[1])
    both = _step_ms(pool, 32)
    assert [m.num_streams() for m in pool.members] == [16, 16]
    print(f"\nfull-size talker step (bf16, graphed): one replica x 16 streams {one:.2f} ms wall "
          f"({gpu_one:.2f} ms on its CUDA stream); two replicas x 16 streams {both:.2f} ms wall "
          f"(serial would be {2 * one:.2f} ms)")
    assert both < 1.5 * one, (both, one)  # side by side: ~1x; one after the other: 2x
