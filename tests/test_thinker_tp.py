"""Thinker tensor parallelism simulated on CPU: two gloo ranks must reproduce the TP=1 logits and decode."""

from __future__ import annotations

import torch
from thinker_support import greedy_decode, spawn_ranks

from realtime_ming.model.layers import TPGroup
from realtime_ming.model.thinker import load_thinker

WORLD = 2
NEW_TOKENS = 4


def _worker(rank: int, root: str, ids: torch.Tensor, out_dir: str) -> None:
    thinker = load_thinker(root, tp=TPGroup(rank, WORLD))
    torch.save(greedy_decode(thinker, ids, NEW_TOKENS), f"{out_dir}/rank{rank}.pt")


def test_thinker_tp2_matches_tp1(fixture_root, load_case, tmp_path):
    """Logits of both TP=2 ranks equal TP=1 within 1e-4 and the cached greedy tokens are identical."""
    tensors, _ = load_case("thinker_text")
    ids = tensors["input_ids"]
    ref_logits, ref_tokens = greedy_decode(load_thinker(fixture_root), ids, NEW_TOKENS)
    spawn_ranks(_worker, WORLD, str(fixture_root), ids, str(tmp_path))
    for rank in range(WORLD):
        logits, tokens = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
        assert torch.equal(tokens, ref_tokens)
