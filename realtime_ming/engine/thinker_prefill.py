"""Thinker prefill of one prompt chunk, CUDA-graphed per width bucket.

An eager prefill is ~2,500 kernel launches (32 layers of norms, rotary, three routers, expert
sorting): on an H200 a 100-token prefill took 59 ms of which the GPU was busy 23 ms. A graph
replays the same work without the launches. One row (the common case: one user turn arriving)
of W tokens is padded to the smallest width bucket >= W with cache position -1 (K/V go to the
cache's sink column, no real query sees them) and attends over the whole slot (kv_len = capacity,
masked by position), so one graph per width serves every slot and prefix length. Both router
masks are always inputs (all False for text), so a graph serves text, audio and image tokens.
Batches of several rows and chunks wider than the largest bucket run eagerly (`ThinkerRunner`).
On a tensor-parallel group every rank builds and captures the same prefiller (`tp.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from .graphs import BucketedGraph, GraphInput, pick_bucket

__all__ = ["ThinkerPrefiller", "DEFAULT_PREFILL_WIDTHS"]

log = logging.getLogger(__name__)

DEFAULT_PREFILL_WIDTHS = (32, 64, 128, 192, 256, 384, 512)

Progress = Callable[[str, int, int], None]


class ThinkerPrefiller:
    """`step(embeds, rotary, cpos, slots, image_mask, audio_mask)` -> final-normed hidden [1, W, D] (graph memory).

    embeds [1, W, D]; rotary [3, 1, W] int64; cpos [1, W] int64 cache positions; slots [1] int64;
    image_mask / audio_mask [1, W] bool. `fits(width)` says whether a graph serves that width.
    """

    def __init__(self, thinker, cache, widths: Sequence[int], *, dtype: torch.dtype, device: torch.device | str,
                 enforce_eager: bool = False):
        self.thinker, self.cache = thinker, cache
        self.device = torch.device(device)
        widths = sorted({min(int(w), cache.capacity) for w in widths})
        top, d = max(widths), thinker.cfg.hidden_size
        specs = {"embeds": GraphInput((1, top, d), dtype, batch_dim=1),
                 "rotary": GraphInput((3, 1, top), torch.int64, batch_dim=2),
                 "cpos": GraphInput((1, top), torch.int64, batch_dim=1, pad=-1),  # padding -> the sink column
                 "slots": GraphInput((1,), torch.int64, batch_dim=None),
                 "image_mask": GraphInput((1, top), torch.bool, batch_dim=1, pad=False),
                 "audio_mask": GraphInput((1, top), torch.bool, batch_dim=1, pad=False)}
        self.graph = BucketedGraph(self._fn, specs, widths, device=self.device, output_batch_dims=1,
                                   enforce_eager=enforce_eager or self.device.type != "cuda")

    def _fn(self, embeds, rotary, cpos, slots, image_mask, audio_mask):
        return self.thinker(embeds, rotary, cache=self.cache, slots=slots, cache_positions=cpos,
                            kv_len=self.cache.capacity, image_mask=image_mask, audio_mask=audio_mask)

    @property
    def eager(self) -> bool:
        return self.graph.eager

    @property
    def graphed(self) -> bool:
        return self.graph.graphed

    def fits(self, width: int) -> bool:
        return self.graphed and pick_bucket(self.graph.buckets, width) is not None

    def capture(self, progress: Progress | None = None) -> None:
        """Capture every width bucket, largest first (no-op when eager). Padding inputs only: all K/V
        writes go to the sink column."""
        if self.eager:
            return
        if progress is not None:
            progress("capturing thinker prefill graphs", 0, 1)
        t0 = time.monotonic()
        self.graph.capture()
        if progress is not None:
            progress("capturing thinker prefill graphs", 1, 1)
        log.info("thinker prefill: %d CUDA graphs (widths %s) in %.1f s", len(self.graph.buckets),
                 list(self.graph.buckets), time.monotonic() - t0)

    @torch.no_grad()
    def step(self, embeds: torch.Tensor, rotary: torch.Tensor, cpos: torch.Tensor, slots: torch.Tensor,
             image_mask: torch.Tensor, audio_mask: torch.Tensor) -> torch.Tensor:
        return self.graph.step(embeds=embeds, rotary=rotary, cpos=cpos, slots=slots, image_mask=image_mask,
                               audio_mask=audio_mask)
