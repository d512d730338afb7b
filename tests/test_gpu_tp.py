"""Thinker TP=2 over NCCL on two GPUs equals TP=1 on one (fixture checkpoint; eager and CUDA-graphed decode)."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from realtime_ming.engine.graphs import BucketedGraph, GraphInput
from realtime_ming.model.layers import TPGroup
from realtime_ming.model.rope3d import text_position_ids
from realtime_ming.model.kernels import TRITON
from realtime_ming.model.thinker import ThinkerKVCache, load_thinker

WORLD = 2
NEW_TOKENS = 4
pytestmark = pytest.mark.skipif(torch.cuda.device_count() < WORLD,
                                reason=f"needs {WORLD} CUDA GPUs (found {torch.cuda.device_count()})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _worker(rank: int, port: int, root: str, ids: torch.Tensor, out_dir: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        thinker = load_thinker(root, tp=TPGroup(rank, WORLD), device=f"cuda:{rank}", kernels=TRITON)
        results = [_run(thinker, ids, f"cuda:{rank}", graphed) for graphed in (False, True)]
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_fixture_thinker_tp2_nccl_matches_tp1(fixture_root, load_case, tmp_path):
    """fp32 logits of both NCCL ranks (eager and graphed decode) equal TP=1 within 1e-4; greedy tokens identical."""
    tensors, _ = load_case("thinker_text")
    ids = tensors["input_ids"]
    ref_logits, ref_tokens = _run(load_thinker(fixture_root, device="cuda:0", kernels=TRITON), ids, "cuda:0", graphed=False)
    mp.spawn(_worker, args=(_free_port(), str(fixture_root), ids, str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        for logits, tokens in torch.load(tmp_path / f"rank{rank}.pt"):
            torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
            assert torch.equal(tokens, ref_tokens)
