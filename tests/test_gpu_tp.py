"""Thinker TP=2 over NCCL on two GPUs equals TP=1 on one (fixture checkpoint; eager and CUDA-graphed decode)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from thinker_support import spawn_ranks

from realtime_ming.engine.graphs import BucketedGraph, GraphInput
from realtime_ming.model.kernels import TRITON
from realtime_ming.model.kernels.all_reduce import OneShotAllReduce
from realtime_ming.model.layers import TPGroup
from realtime_ming.model.rope3d import text_position_ids
from realtime_ming.model.thinker import ThinkerKVCache, load_thinker

WORLD = 2
NEW_TOKENS = 4
pytestmark = pytest.mark.skipif(torch.cuda.device_count() < WORLD,
                                reason=f"needs {WORLD} CUDA GPUs (found {torch.cuda.device_count()})")


@torch.no_grad()
def _run(thinker, ids: torch.Tensor, device: str, graphed: bool):
    """Prompt logits [1, T, V] and NEW_TOKENS greedy ids decoded through the cache (decode graphed or not)."""
    t = ids.shape[1]
    ids = ids.to(device)
    pos = torch.arange(t, device=device)[None]
    cache = ThinkerKVCache.allocate(thinker.cfg, 1, t + NEW_TOKENS, device=device, dtype=torch.float32, tp=thinker.tp)
    slots, zero = torch.zeros(1, dtype=torch.int64, device=device), torch.zeros(1, dtype=torch.int64, device=device)
    logits = thinker.logits(thinker(thinker.embed(ids), pos.expand(3, 1, t), cache=cache, slots=slots,
                                    cache_positions=pos))

    def decode(token, cp):
        h = thinker(thinker.embed(token), text_position_ids(cp, zero), cache=cache, slots=slots, cache_positions=cp)
        return thinker.logits(h[:, -1])

    step = BucketedGraph(decode, {"token": GraphInput((1, 1), torch.int64), "cp": GraphInput((1, 1), torch.int64, pad=-1)},
                         (1,), device=device, enforce_eager=not graphed)
    token, out = logits[:, -1].argmax(-1), []
    for i in range(NEW_TOKENS):
        out.append(token)
        token = step.step(token=token[:, None], cp=torch.full((1, 1), t + i, device=device)).argmax(-1)
    return logits.cpu(), torch.stack(out, dim=1).cpu()


def _worker(rank: int, root: str, ids: torch.Tensor, out_dir: str, all_reduce: str) -> None:
    one_shot = OneShotAllReduce(f"cuda:{rank}", torch.float32) if all_reduce == "one_shot" else None
    tp = TPGroup(rank, WORLD, one_shot=one_shot)
    thinker = load_thinker(root, tp=tp, device=f"cuda:{rank}", kernels=TRITON)
    results = [_run(thinker, ids, f"cuda:{rank}", graphed) for graphed in (False, True)]
    torch.save(results, f"{out_dir}/rank{rank}.pt")


@pytest.mark.parametrize("all_reduce", ["nccl", "one_shot"])
def test_fixture_thinker_tp2_nccl_matches_tp1(fixture_root, load_case, tmp_path, all_reduce):
    """fp32 logits of both ranks (eager and graphed decode) equal TP=1 within 1e-4; greedy tokens identical —
    every all-reduce over NCCL, or the small ones through the symmetric-memory one-shot kernel."""
    tensors, _ = load_case("thinker_text")
    ids = tensors["input_ids"]
    ref_logits, ref_tokens = _run(load_thinker(fixture_root, device="cuda:0", kernels=TRITON), ids, "cuda:0", graphed=False)
    spawn_ranks(_worker, WORLD, str(fixture_root), ids, str(tmp_path), all_reduce, backend="nccl")
    for rank in range(WORLD):
        for logits, tokens in torch.load(tmp_path / f"rank{rank}.pt"):
            torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
            assert torch.equal(tokens, ref_tokens)


def _one_shot_worker(rank: int, out_dir: str) -> None:
    ar = OneShotAllReduce(f"cuda:{rank}", torch.bfloat16, max_bytes=64 * 1024)
    gen = torch.Generator(device=f"cuda:{rank}").manual_seed(rank)
    results = {}
    for rows in (1, 3, 8):  # [rows, 1, 4096] bf16 = 8 KiB per row: all within max_bytes
        x = torch.randn(rows, 1, 4096, generator=gen, device=f"cuda:{rank}").to(torch.bfloat16)
        want, before = x.clone(), x.clone()
        dist.all_reduce(want)
        results[rows] = (ar(x).cpu(), want.cpu(), x.cpu(), before.cpu())
    big = torch.ones(16, 4096, dtype=torch.bfloat16, device=f"cuda:{rank}")  # 128 KiB: above max_bytes
    results["big_is_none"] = ar(big) is None and ar(big.float()) is None and ar(big.t()) is None
    # in a CUDA graph: the same kernel replayed on new inputs gives new sums
    x = torch.zeros(2, 4096, dtype=torch.bfloat16, device=f"cuda:{rank}")
    ar(x)  # warm-up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ar(x)
    replays = []
    for k in range(3):
        x.fill_(float(rank + 1 + k))
        graph.replay()
        torch.cuda.synchronize()
        replays.append(y.float().cpu())
    results["replays"] = replays
    torch.save(results, f"{out_dir}/one_shot{rank}.pt")


def test_one_shot_all_reduce_sums_like_nccl_and_replays_in_a_graph(tmp_path):
    """The symmetric-memory all-reduce returns NCCL's sums (bf16, several shapes, input untouched), declines what
    it does not take (too big, another dtype, not contiguous) and gives fresh sums on every graph replay."""
    spawn_ranks(_one_shot_worker, WORLD, str(tmp_path), backend="nccl")
    for rank in range(WORLD):
        res = torch.load(tmp_path / f"one_shot{rank}.pt")
        for rows in (1, 3, 8):
            got, want, x_after, x_before = res[rows]
            torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
            assert got.shape == want.shape
            assert torch.equal(x_after, x_before)
        assert res["big_is_none"]
        for k, y in enumerate(res["replays"]):
            want = sum(r + 1 + k for r in range(WORLD))
            assert torch.all(y == want), (k, y.unique())
