"""Two GPUs, NCCL: the tensor-parallel thinker with CUDA-graphed decode closes cleanly and within a bound (the
graphs that captured collectives are released before any rank leaves its group), a new group starts in the
same process afterwards, and TP=2 over a 1-KV-head checkpoint (the head replicated on both ranks) decodes
like TP=1."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from realtime_ming.engine.thinker_decode import ThinkerDecoder
from realtime_ming.engine.tp import start_tp
from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.kernels import TRITON
from realtime_ming.model.thinker import ThinkerKVCache, load_thinker
from checkpoint_support import make_variant

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(torch.cuda.device_count() < 2,
                                 reason=f"needs 2 CUDA GPUs (found {torch.cuda.device_count()})")]
DEVICES = ("cuda:0", "cuda:1")
SEQ = 256
TOKENS = [5, 17, 3, 250, 42, 7, 99, 1]  # taken modulo the set's vocab size


def _graphed_tp2(root):
    proxy = start_tp(load_checkpoint_config(root), DEVICES, str(root), torch.float32, 0, 2, SEQ)
    cache = ThinkerKVCache.allocate(proxy.cfg, 2, SEQ, device=DEVICES[0], dtype=torch.float32, tp=proxy.tp)
    decoder = proxy.decoder(cache, (1, 2), (SEQ,))
    decoder.capture()
    assert decoder.graphed
    return proxy, decoder


def _teacher_forced(decoder, vocab: int) -> torch.Tensor:
    """Logits [len(TOKENS), V] of decoding TOKENS (modulo `vocab`) one at a time into slot 1."""
    return torch.stack([decoder.step([t % vocab], [i], [0], [1])[0].float().cpu().clone()
                        for i, t in enumerate(TOKENS)])


def test_gpu_tp2_graphed_close_is_clean_and_bounded(fixture_root):
    for _ in range(2):  # the second group starts in the same process after the first closed
        proxy, decoder = _graphed_tp2(fixture_root)
        assert torch.isfinite(_teacher_forced(decoder, proxy.cfg.vocab_size)).all()
        procs = list(proxy.procs)
        started = time.monotonic()
        proxy.close()
        assert time.monotonic() - started < 30.0
        assert [p.exitcode for p in procs] == [0]  # the worker released its graphs and left its group
        assert not dist.is_initialized()


def test_gpu_tp2_with_one_replicated_kv_head_decodes_like_tp1(fixture_root, tmp_path):
    _, root = make_variant(fixture_root, tmp_path)
    assert load_checkpoint_config(root).thinker.num_key_value_heads == 1
    one = load_thinker(root, device=DEVICES[0], kernels=TRITON)
    cache = ThinkerKVCache.allocate(one.cfg, 2, SEQ, device=DEVICES[0], dtype=torch.float32, tp=one.tp)
    with torch.no_grad():
        want = _teacher_forced(ThinkerDecoder(one, cache, (1, 2), (SEQ,), device=DEVICES[0], enforce_eager=True),
                               one.cfg.vocab_size)
    del one, cache
    proxy, decoder = _graphed_tp2(root)
    try:
        with torch.no_grad():
            got = _teacher_forced(decoder, proxy.cfg.vocab_size)
    finally:
        proxy.close()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
