"""Tensor-parallel thinker in the engine: TP=2 (gloo, two CPU processes) equals TP=1 on the fixture weights."""

from __future__ import annotations

import threading

import pytest

from realtime_ming.engine import Engine
from realtime_ming.engine.api import Content, Message, SamplingParams, TurnDone, TurnRequest
from realtime_ming.engine.config import EngineConfig, PlacementConfig, ThinkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.models import ModelBundle
from conftest import fixture_tokenizers


def _greedy_text(fixture_root, devices) -> TurnDone:
    cfg = EngineConfig(model_path=str(fixture_root), tokenizer_path=fixture_tokenizers(fixture_root)[0],
                       talker_tokenizer_path=fixture_tokenizers(fixture_root)[1],
                       placement=PlacementConfig(thinker_devices=devices))
    engine = Engine.create(cfg, warmup=False)
    try:
        request = TurnRequest("t", "c", (Message("user", (Content.of_text("Hello, how are you today?"),)),),
                              sampling=SamplingParams(max_tokens=10, ignore_eos=True), with_audio=False)
        return _run_turn(engine, request)
    finally:
        engine.close()


def _run_turn(engine: Engine, request: TurnRequest) -> TurnDone:
    done, events = threading.Event(), []

    def sink(ev):
        events.append(ev)
        if isinstance(ev, TurnDone):
            done.set()

    engine.submit(request, sink)
    assert done.wait(120), events[-3:]
    return events[-1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_engine_tp2_fixture_greedy_equals_tp1(fixture_root):
    """The fixture thinker sharded over two ranks generates exactly the TP=1 greedy tokens."""
    one = _greedy_text(fixture_root, ("cpu",))
    two = _greedy_text(fixture_root, ("cpu", "cpu"))
    assert one.output_tokens == two.output_tokens == 10
    assert two.text == one.text


def test_tp_shadow_hook_builds_rank0_shards_and_serves(tmp_path):
    """The tp_shadow=2 hook (benchmarks): one process, rank-0 shard shapes, no collectives; a turn completes."""
    cfg = EngineConfig(thinker=ThinkerRunnerConfig(max_slots=2, max_seq_len=256))
    engine = Engine.create(cfg, warmup=False, hooks=EngineHooks(tp_shadow=2))
    try:
        thinker = engine.bundle.thinker
        full = engine.bundle.cfg.thinker
        assert thinker.tp.shadow and thinker.tp.size == 2
        attn = thinker.model.layers[0].attention
        assert attn.num_heads == full.num_attention_heads // 2 and attn.num_kv == full.num_key_value_heads // 2
        assert thinker.lm_head.weight.shape[0] == full.vocab_size // 2
        request = TurnRequest("t", "c", (Message("user", (Content.of_text("Hello there"),)),),
                              sampling=SamplingParams(max_tokens=6, ignore_eos=True), with_audio=True)
        done = _run_turn(engine, request)
        assert done.output_tokens == 6 and done.audio_samples > 0
    finally:
        engine.close()


def test_tp_shadow_hook_refuses_a_real_checkpoint(fixture_root):
    with pytest.raises(ValueError, match="tp_shadow"):
        ModelBundle.load(EngineConfig(model_path=str(fixture_root)), hooks=EngineHooks(tp_shadow=2))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tp2_prefiller_with_row_buckets_equals_the_sharded_forward(fixture_root):
    """The prefiller every rank builds (row buckets, token budget) pads a 3-row chunk to its 4-row bucket on
    each rank alike: the same hidden states as the sharded plain forward of the 3 rows (gloo, two CPU ranks)."""
    import torch

    cfg = EngineConfig(model_path=str(fixture_root), tokenizer_path=fixture_tokenizers(fixture_root)[0],
                       talker_tokenizer_path=fixture_tokenizers(fixture_root)[1],
                       placement=PlacementConfig(thinker_devices=("cpu", "cpu")))
    engine = Engine.create(cfg, warmup=False)
    try:
        runner = engine._thinker
        proxy, cache = runner.model, runner.cache
        pre = proxy.prefiller(cache, (16, 32), rows=(1, 2, 4), tokens=128)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, 400, (3, 20), generator=gen)
        emb = proxy.embed(ids)
        cpos = torch.arange(20).expand(3, 20).clone()
        cpos[0, 12:] = -1  # a shorter row, padded
        rot = cpos.clamp(min=0)[None].expand(3, 3, 20).contiguous()
        audio = torch.zeros(3, 20, dtype=torch.bool)
        slots = torch.tensor([1, 2, 3])
        with torch.no_grad():
            got = pre.step(emb, rot, cpos, slots, torch.zeros_like(audio), audio).clone()
            want = proxy(emb, rot, cache=cache, slots=slots, cache_positions=cpos, kv_len=cache.capacity,
                         image_mask=torch.zeros_like(audio), audio_mask=audio)
        live = cpos >= 0
        torch.testing.assert_close(got[live], want[live], rtol=1e-5, atol=1e-5)
    finally:
        engine.close()


@pytest.mark.slow
def test_start_tp_cleans_up_when_rank0_shard_build_fails(fixture_root, monkeypatch):
    """An injected failure in rank 0's shard build propagates, leaves no process group and no worker
    process behind, and the next start_tp in this process works."""
    import multiprocessing

    import torch
    import torch.distributed as dist

    from realtime_ming.engine import tp as tp_module
    from realtime_ming.model.config import load_checkpoint_config

    ck = load_checkpoint_config(fixture_root)
    args = (ck, ("cpu", "cpu"), str(fixture_root), torch.float32, 0, 2, 64)
    built = tp_module._build_shard

    def failing(launch, tp):
        if tp.rank == 0:
            raise RuntimeError("injected rank-0 shard failure")
        return built(launch, tp)

    monkeypatch.setattr(tp_module, "_build_shard", failing)
    with pytest.raises(RuntimeError, match="injected rank-0 shard failure"):
        tp_module.start_tp(*args)
    assert not dist.is_initialized()
    assert not [p for p in multiprocessing.active_children() if p.is_alive() and p.name.startswith("tp-rank-")]
    monkeypatch.setattr(tp_module, "_build_shard", built)
    proxy = tp_module.start_tp(*args)
    try:
        assert dist.is_initialized() and proxy.tp.size == 2
    finally:
        proxy.close()
    assert not dist.is_initialized()


def test_one_shot_all_reduce_on_cpu_ranks_fails_cleanly(fixture_root):
    """engine.thinker.all_reduce=one_shot needs CUDA: on CPU ranks start_tp raises a clear error and leaves no
    process group and no worker behind (never a silent fallback that could differ between ranks)."""
    import multiprocessing

    import torch
    import torch.distributed as dist

    from realtime_ming.engine import tp as tp_module
    from realtime_ming.model.config import load_checkpoint_config

    ck = load_checkpoint_config(fixture_root)
    with pytest.raises(ValueError, match="all_reduce=one_shot needs CUDA"):
        tp_module.start_tp(ck, ("cpu", "cpu"), str(fixture_root), torch.float32, 0, 2, 64, all_reduce="one_shot")
    assert not dist.is_initialized()
    # its rank workers (named tp-rank-N); other processes of this pytest process (another file's servers, their
    # frame-parser children) come and go on their own schedule and are not start_tp's
    assert not [p for p in multiprocessing.active_children() if p.is_alive() and p.name.startswith("tp-rank-")]
