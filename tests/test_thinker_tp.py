"""Thinker tensor parallelism simulated on CPU: two gloo ranks must reproduce the TP=1 logits and decode."""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from realtime_ming.model.layers import TPGroup
from realtime_ming.model.rope3d import text_position_ids
from realtime_ming.model.thinker import ThinkerKVCache, load_thinker

WORLD = 2
NEW_TOKENS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(thinker, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-prompt logits [1, T, V] and NEW_TOKENS greedy ids decoded through the KV cache."""
    t = ids.shape[1]
    pos = torch.arange(t)[None]
    cache = ThinkerKVCache.allocate(thinker.cfg, 1, t + NEW_TOKENS, tp=thinker.tp)
    slots, zero = torch.tensor([0]), torch.zeros(1, dtype=torch.int64)
    with torch.no_grad():
        logits = thinker.logits(thinker(thinker.embed(ids), pos.expand(3, 1, t), cache=cache, slots=slots,
                                        cache_positions=pos))
        token, out = logits[:, -1].argmax(-1), []
        for step in range(NEW_TOKENS):
            out.append(token)
            cp = torch.tensor([[t + step]])
            h = thinker(thinker.embed(token[:, None]), text_position_ids(cp, zero), cache=cache, slots=slots,
                        cache_positions=cp)
            token = thinker.logits(h[:, -1]).argmax(-1)
    return logits, torch.stack(out, dim=1)


def _worker(rank: int, port: int, root: str, ids: torch.Tensor, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        torch.save(_run(load_thinker(root, tp=TPGroup(rank, WORLD)), ids), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_thinker_tp2_matches_tp1(fixture_root, load_case, tmp_path):
    """Logits of both TP=2 ranks equal TP=1 within 1e-4 and the cached greedy tokens are identical."""
    tensors, _ = load_case("thinker_text")
    ids = tensors["input_ids"]
    ref_logits, ref_tokens = _run(load_thinker(fixture_root), ids)
    mp.spawn(_worker, args=(_free_port(), str(fixture_root), ids, str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        logits, tokens = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
        assert torch.equal(tokens, ref_tokens)
