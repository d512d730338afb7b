"""Thinker decode step: one token per row -> next-token logits, CUDA-graphed per (KV bucket, batch bucket).

With the fused decode attention (CUDA, `model.kernels.slot_attention`) every row reads its own slot up to
its own position, so one graph per batch bucket serves every length. Otherwise attention reads the
first `kv_len` positions of each row's KV slot, and a CUDA graph needs that length fixed: the
decoder keeps one `BucketedGraph` per KV bucket (the smallest one covering the longest row is
replayed), each with the batch buckets, all in one memory pool. Eager (CPU, or `enforce_eager`):
the same function with kv_len rounded up to 64; on a CPU the rows are decoded in groups of like lengths
(`kv_groups`), so that a short row does not read a long row's length (beside a 4,200-token image turn two short
rows cost ~5x their own work, 171 against 35 ms of host time for the three, issue 43). On a tensor-parallel group every
rank builds the same decoder over its own shard and cache and replays the same graph, so the NCCL
all-reduces captured inside line up (see `tp.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from .graphs import BucketedGraph, GraphInput, pick_bucket, upload

__all__ = ["KV_BLOCK", "ThinkerDecoder", "default_kv_buckets", "eager_kv_len", "kv_groups"]

log = logging.getLogger(__name__)

KV_BLOCK = 64  # eager attention reads the first kv_len cache positions, rounded up to this

Progress = Callable[[str, int, int], None]


def eager_kv_len(needed: int, capacity: int) -> int:
    """Cache positions an eager attention reads: `needed` rounded up to KV_BLOCK, at most `capacity`."""
    return min(-(-needed // KV_BLOCK) * KV_BLOCK, capacity)


def kv_groups(positions: Sequence[int], capacity: int) -> list[list[int]]:
    """The rows (indices into `positions`) of an eager decode step in groups, longest first, such that no row
    reads more than twice its own eager length (`eager_kv_len`) because of another row in its group."""
    order = sorted(range(len(positions)), key=lambda i: positions[i], reverse=True)
    groups: list[list[int]] = []
    for i in order:
        if groups and 2 * eager_kv_len(positions[i] + 1, capacity) >= eager_kv_len(positions[groups[-1][0]] + 1,
                                                                                     capacity):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def default_kv_buckets(max_seq_len: int, smallest: int = 512) -> tuple[int, ...]:
    """Powers of two from `smallest` below max_seq_len, then max_seq_len itself (always covered)."""
    out, k = [], smallest
    while k < max_seq_len:
        out.append(k)
        k *= 2
    out.append(max_seq_len)
    return tuple(out)


class ThinkerDecoder:
    """`step(tokens, positions, deltas, slots)` -> fp32 logits [B, V] (full vocabulary).

    tokens: last sampled id per row; positions: the cache index the token goes to (= tokens already
    in the slot); deltas: rope_delta per row (rotary position = position + delta, the 3 axes equal
    for text); slots: KV slot per row. Lists of ints, one entry per row, B >= 1. The returned
    logits are graph memory when graphed: valid until the next `step`.
    """

    def __init__(self, thinker, cache, batch_buckets: Sequence[int], kv_buckets: Sequence[int], *,
                 device: torch.device | str, enforce_eager: bool = False):
        self.thinker, self.cache = thinker, cache
        self.device = torch.device(device)
        self.eager = enforce_eager or self.device.type != "cuda"
        self.batch_buckets = tuple(sorted(set(batch_buckets)))
        if thinker.decode_reads_exact_lengths(self.device):  # the fused attention reads each row's own length
            kv_buckets = (cache.capacity,)
        self.kv_buckets = tuple(sorted({min(int(k), cache.capacity) for k in kv_buckets}))
        top = max(self.batch_buckets)
        specs = {"tok": GraphInput((top, 1), torch.int64),  # [B, 1] token ids
                 "pos": GraphInput((top, 1), torch.int64, pad=-1),  # [B, 1] cache index, -1 = padding row (sink)
                 "delta": GraphInput((top, 1), torch.int64),  # [B, 1] rope delta
                 "slots": GraphInput((top,), torch.int64)}  # [B] KV slot
        pool = None if self.eager else torch.cuda.graph_pool_handle()
        self._graphs = {kv: BucketedGraph(self._fn(kv), specs, self.batch_buckets, device=self.device,
                                          enforce_eager=self.eager, pool=pool) for kv in self.kv_buckets}

    def _fn(self, kv_len: int):
        thinker, cache = self.thinker, self.cache

        def step(tok, pos, delta, slots):
            rotary = (pos + delta).unsqueeze(0).expand(3, -1, -1)  # [3, B, 1]
            hidden = thinker(thinker.embed(tok), rotary, cache=cache, slots=slots, cache_positions=pos,
                             kv_len=kv_len)
            return thinker.logits(hidden[:, -1])

        return step

    @property
    def graphed(self) -> bool:
        return any(g.graphed for g in self._graphs.values())

    def release(self) -> None:
        """Free every captured graph (see `BucketedGraph.release`); later steps run eager."""
        for graph in self._graphs.values():
            graph.release()
        self.eager = True

    def capture(self, progress: Progress | None = None) -> None:
        """Capture every (KV bucket, batch bucket) graph, largest first (no-op when eager)."""
        if self.eager:
            return
        t0 = time.monotonic()
        order = sorted(self._graphs, reverse=True)
        for i, kv in enumerate(order):
            if progress is not None:
                progress(f"capturing thinker decode graphs (kv {kv})", i, len(order))
            self._graphs[kv].capture()
        if progress is not None:
            progress("capturing thinker decode graphs", len(order), len(order))
        log.info("thinker decode: %d CUDA graphs (kv %s x batch %s) in %.1f s", len(order) * len(self.batch_buckets),
                 list(self.kv_buckets), list(self.batch_buckets), time.monotonic() - t0)

    @torch.no_grad()
    def step(self, tokens: list[int], positions: list[int], deltas: list[int], slots: list[int]) -> torch.Tensor:
        packed = upload([tokens, positions, deltas, slots], torch.int64, self.device)  # [4, B]
        tok, pos, delta = (packed[i].unsqueeze(1) for i in range(3))  # [B, 1] each
        needed = max(positions) + 1
        kv = None if self.eager else pick_bucket(self.kv_buckets, needed)
        if kv is None:  # eager, or longer than every KV bucket
            groups = kv_groups(positions, self.cache.capacity) if self.device.type == "cpu" else [[]]
            if len(groups) == 1:
                return self._fn(eager_kv_len(needed, self.cache.capacity))(tok, pos, delta, packed[3])
            parts = []
            for rows in groups:  # the host computes each group's attention over its own length only
                at = torch.tensor(rows, device=self.device)
                kv_len = eager_kv_len(positions[rows[0]] + 1, self.cache.capacity)
                parts.append(self._fn(kv_len)(tok[at], pos[at], delta[at], packed[3][at]))
            order = torch.tensor([i for rows in groups for i in rows], device=self.device)
            grouped = torch.cat(parts)
            return torch.empty_like(grouped).index_copy_(0, order, grouped)
        return self._graphs[kv].step(tok=tok, pos=pos, delta=delta, slots=packed[3])
