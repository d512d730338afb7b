"""Thinker prefill of one prompt chunk, CUDA-graphed per width bucket.

An eager prefill is ~2,500 kernel launches (32 layers of norms, rotary, three routers, expert
sorting): on an H200 a 100-token prefill took 59 ms of which the GPU was busy 23 ms. A graph
replays the same work without the launches. One row (the common case: one user turn arriving)
of W tokens is padded to the smallest width bucket >= W with cache position -1 (K/V go to the
cache's sink column, no real query sees them) and attends over the whole slot (kv_len = capacity,
masked by position), so one graph per width serves every slot and prefix length. Both router
masks are always inputs (all False for text), so a graph serves text, audio and image tokens.
Several prompts prefilled together (a burst of turns) take the graph of their row bucket (1, 2, 4, 8,
16: rows x width <= the chunk budget); chunks wider than every bucket run eagerly (`ThinkerRunner`).
A prefill reads most of the experts whatever its width, so one batched chunk costs about one prompt's.
On a tensor-parallel group every rank builds and captures the same prefiller (`tp.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from .graphs import BucketedGraph, GraphInput, pick_bucket

__all__ = ["ThinkerPrefiller"]

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]


class ThinkerPrefiller:
    """`step(embeds, rotary, cpos, slots, image_mask, audio_mask)` -> final-normed hidden [R, W, D] (graph memory).

    embeds [R, W, D]; rotary [3, R, W] int64; cpos [R, W] int64 cache positions; slots [R] int64;
    image_mask / audio_mask [R, W] bool. One `BucketedGraph` over the widths per row bucket (R padded up
    to the next of `rows`: padding rows write only the sink column of slot 0), with rows x width <=
    `tokens`; all in one memory pool. `fits(width, rows)` says whether a graph serves that chunk.
    """

    def __init__(self, thinker, cache, widths: Sequence[int], *, dtype: torch.dtype, device: torch.device | str,
                 rows: Sequence[int] = (1,), tokens: int | None = None, enforce_eager: bool = False):
        self.thinker, self.cache = thinker, cache
        self.device = torch.device(device)
        widths = sorted({min(int(w), cache.capacity) for w in widths})
        tokens = tokens or max(widths)
        self.eager = enforce_eager or self.device.type != "cuda"
        pool = None if self.eager else torch.cuda.graph_pool_handle()
        d = thinker.cfg.hidden_size
        self.graphs: dict[int, BucketedGraph] = {}
        for r in sorted({int(r) for r in rows} | {1}):
            fitting = [w for w in widths if r * w <= tokens]
            if not fitting:
                continue
            top = max(fitting)
            specs = {"embeds": GraphInput((r, top, d), dtype, batch_dim=1),
                     "rotary": GraphInput((3, r, top), torch.int64, batch_dim=2),
                     "cpos": GraphInput((r, top), torch.int64, batch_dim=1, pad=-1),  # padding -> the sink column
                     "slots": GraphInput((r,), torch.int64, batch_dim=None),
                     "image_mask": GraphInput((r, top), torch.bool, batch_dim=1, pad=False),
                     "audio_mask": GraphInput((r, top), torch.bool, batch_dim=1, pad=False)}
            self.graphs[r] = BucketedGraph(self._fn, specs, fitting, device=self.device, output_batch_dims=1,
                                           enforce_eager=self.eager, pool=pool)

    def _fn(self, embeds, rotary, cpos, slots, image_mask, audio_mask):
        return self.thinker(embeds, rotary, cache=self.cache, slots=slots, cache_positions=cpos,
                            kv_len=self.cache.capacity, image_mask=image_mask, audio_mask=audio_mask)

    @property
    def graphed(self) -> bool:
        return any(g.graphed for g in self.graphs.values())

    def fits(self, width: int, rows: int = 1) -> bool:
        r = pick_bucket(tuple(self.graphs), rows)
        return self.graphed and r is not None and pick_bucket(self.graphs[r].buckets, width) is not None

    def release(self) -> None:
        """Free every captured graph (see `BucketedGraph.release`); later steps run eager."""
        for graph in self.graphs.values():
            graph.release()
        self.eager = True

    def capture(self, progress: Progress | None = None) -> None:
        """Capture every (rows, width) bucket, largest first (no-op when eager). Padding inputs only: all K/V
        writes go to the sink column."""
        if self.eager:
            return
        t0, order = time.monotonic(), sorted(self.graphs, reverse=True)
        for i, r in enumerate(order):
            if progress is not None:
                progress(f"capturing thinker prefill graphs ({r} rows)", i, len(order))
            self.graphs[r].capture()
        if progress is not None:
            progress("capturing thinker prefill graphs", len(order), len(order))
        log.info("thinker prefill: %d CUDA graphs (rows x widths %s) in %.1f s",
                 sum(len(g.buckets) for g in self.graphs.values()),
                 {r: list(g.buckets) for r, g in self.graphs.items()}, time.monotonic() - t0)

    @torch.no_grad()
    def step(self, embeds: torch.Tensor, rotary: torch.Tensor, cpos: torch.Tensor, slots: torch.Tensor,
             image_mask: torch.Tensor, audio_mask: torch.Tensor) -> torch.Tensor:
        rows = embeds.shape[0]
        bucket = pick_bucket(tuple(self.graphs), rows)
        if bucket is None:
            raise ValueError(f"{rows} prefill rows exceed every row bucket {tuple(self.graphs)}")
        if bucket > rows:  # padding rows: position -1 everywhere (sink writes, outputs dropped), slot 0
            extra = bucket - rows
            embeds = torch.cat((embeds, embeds.new_zeros(extra, *embeds.shape[1:])))
            rotary = torch.cat((rotary, rotary.new_zeros(3, extra, rotary.shape[2])), dim=1)
            cpos = torch.cat((cpos, cpos.new_full((extra, cpos.shape[1]), -1)))
            slots = torch.cat((slots, slots.new_zeros(extra)))
            image_mask = torch.cat((image_mask, image_mask.new_zeros(extra, image_mask.shape[1])))
            audio_mask = torch.cat((audio_mask, audio_mask.new_zeros(extra, audio_mask.shape[1])))
        out = self.graphs[bucket].step(embeds=embeds, rotary=rotary, cpos=cpos, slots=slots, image_mask=image_mask,
                                       audio_mask=audio_mask)
        return out[:rows]
