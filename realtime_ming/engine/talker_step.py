"""Talker per-step work as one function, CUDA-graphed per batch bucket.

One engine step of every active talker stream: the talker-LM decode of the rows that were not
prefilled this step (fresh rows keep their prefill h), `Talker.tail_step` (CFM with CFG +
aggregator + stop head) and the history update. `TalkerStepper` replays it from one
`BucketedGraph` per batch bucket on CUDA; eager on CPU, with `enforce_eager`, or for more rows
than the largest bucket. The noise comes in as inputs: the runner draws it from per-stream
generators, so a stream's audio does not depend on batching or on graphs being on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from ..model.qwen2 import KVCache
from ..model.talker import Talker, history_update
from .graphs import BucketedGraph, GraphInput, pick_bucket

__all__ = ["TalkerPrefiller", "TalkerStepper", "talker_step"]

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]
StepOutputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def talker_step(talker: Talker, cache: KVCache, t_grid: torch.Tensor, sde_args: torch.Tensor,
                next_embed: torch.Tensor, pos: torch.Tensor, fresh: torch.Tensor, h: torch.Tensor, his: torch.Tensor,
                y0: torch.Tensor, sde_rnd: torch.Tensor, *, decode: bool = True) -> StepOutputs:
    """One AR step of B rows over cache rows 0..B-1 (static shapes, no host sync).

    next_embed [B, 1, H] previous aggregator output; pos [B, 1] int64 LM position, -1 for fresh
    and padding rows (their K/V go to the cache's sink slot, invisible); fresh [B] bool (prefilled
    this step: keep `h`); h [B, 1, H]; his [B, Hh, C]; y0 [B, P, C]; sde_rnd [S, B, P, C];
    t_grid [S + 1]; sde_args [3]. `decode=False` (every row fresh, eager only) skips the LM.
    Returns gen_lat [B, P, C], next_embed [B, 1, H], stop_prob [B, 2], h [B, 1, H] (the one the
    tail used) and his [B, Hh, C] (slid by gen_lat).
    """
    if decode:
        h_lm = talker.decode_lm(next_embed, pos, cache.rows(0, next_embed.shape[0]))
        h = torch.where(fresh[:, None, None], h, h_lm)
    gen_lat, next_embed, stop_prob = talker.tail_step(h, his, y0, sde_rnd, t_grid, sde_args)
    return gen_lat, next_embed, stop_prob, h, history_update(his, gen_lat)


class TalkerStepper:
    """`talker_step` over the runner's cache, graphed per batch bucket when CUDA graphs are on.

    Buckets above `rows` (the cache's row count) are clamped to it, so no graph addresses a row
    the cache lacks. Graphed outputs are views of graph memory, valid until the next call.
    """

    def __init__(self, talker: Talker, cache: KVCache, t_grid: torch.Tensor, sde_args: torch.Tensor,
                 buckets: Sequence[int], *, dtype: torch.dtype, device: torch.device | str,
                 enforce_eager: bool = False):
        self.talker, self.cache, self.t_grid, self.sde_args = talker, cache, t_grid, sde_args
        self.device = torch.device(device)
        rows = cache.slot_pos.shape[0]
        buckets = sorted({min(int(b), rows) for b in buckets})
        cfg, top = talker.cfg, max(buckets)
        hid, lat, patch = talker.hidden_size, talker.latent_dim, cfg.patch_size
        specs = {"next_embed": GraphInput((top, 1, hid), dtype),
                 "pos": GraphInput((top, 1), torch.int64, pad=-1),  # padding rows write the sink slot
                 "fresh": GraphInput((top,), torch.bool, pad=True),  # padding rows skip the LM result
                 "h": GraphInput((top, 1, hid), dtype),
                 "his": GraphInput((top, cfg.history_patch_size, lat), dtype),
                 "y0": GraphInput((top, patch, lat), dtype),
                 "sde_rnd": GraphInput((cfg.steps, top, patch, lat), dtype, batch_dim=1)}
        self.graph = BucketedGraph(self._fn, specs, buckets, device=self.device, enforce_eager=enforce_eager)
        self._on_capture: Callable[[int], None] | None = None

    @property
    def graphed(self) -> bool:
        return self.graph.graphed

    def _fn(self, next_embed, pos, fresh, h, his, y0, sde_rnd) -> StepOutputs:
        if self._on_capture is not None and torch.cuda.is_current_stream_capturing():
            self._on_capture(next_embed.shape[0])
        return talker_step(self.talker, self.cache, self.t_grid, self.sde_args, next_embed, pos, fresh, h, his, y0,
                           sde_rnd)

    def capture(self, progress: Progress | None = None) -> None:
        """Capture one graph per bucket, largest first (no-op when eager or already captured).

        Padding inputs only: the LM writes go to the sink slot, so live streams are untouched.
        """
        if self.graph.eager or self.graph.graphed:
            return
        t0, total, done = time.monotonic(), len(self.graph.buckets), []

        def report(batch: int) -> None:
            log.info("talker step: capturing the batch-%d graph (%d/%d)", batch, len(done) + 1, total)
            if progress is not None:
                progress(f"capturing talker step graphs (batch {batch})", len(done), total)
            done.append(batch)

        self._on_capture = report
        try:
            with torch.cuda.device(self.device):
                self.graph.capture()
        finally:
            self._on_capture = None
        if progress is not None:
            progress("capturing talker step graphs", total, total)
        log.info("talker step: %d CUDA graphs (batch %s) in %.1f s", total, list(self.graph.buckets),
                 time.monotonic() - t0)

    @torch.no_grad()
    def __call__(self, next_embed: torch.Tensor, pos: torch.Tensor, fresh: torch.Tensor, h: torch.Tensor,
                 his: torch.Tensor, y0: torch.Tensor, sde_rnd: torch.Tensor, *, all_fresh: bool = False) -> StepOutputs:
        """`talker_step` of these rows (shapes as there, B = rows); `all_fresh` lets eager skip the LM."""
        if self.graph.eager or pick_bucket(self.graph.buckets, next_embed.shape[0]) is None:
            return talker_step(self.talker, self.cache, self.t_grid, self.sde_args, next_embed, pos, fresh, h, his,
                               y0, sde_rnd, decode=not all_fresh)
        self.capture()
        with torch.cuda.device(self.device):
            return self.graph.step(next_embed=next_embed, pos=pos, fresh=fresh, h=h, his=his, y0=y0, sde_rnd=sde_rnd)


class TalkerPrefiller:
    """Talker-LM prefill of one new stream's prompt, CUDA-graphed per prompt-length bucket.

    The graph prefills a one-row staging cache (the prompt padded with position -1: its K/V go to
    the sink slot); the caller's row then receives a copy of that row (~3 MB). Eager (CPU,
    enforce_eager, longer prompts): `Talker.prefill` straight into the caller's row.
    """

    def __init__(self, talker: Talker, capacity: int, buckets: Sequence[int], *, dtype: torch.dtype,
                 device: torch.device | str, enforce_eager: bool = False):
        self.talker, self.device = talker, torch.device(device)
        buckets = sorted({min(int(b), capacity) for b in buckets})
        top, hid = max(buckets), talker.hidden_size
        self.stage = KVCache.allocate(talker.cfg.llm, 1, capacity, self.device, dtype)
        specs = {"embeds": GraphInput((1, top, hid), dtype, batch_dim=1),
                 "positions": GraphInput((1, top), torch.int64, batch_dim=1, pad=-1)}
        self.graph = BucketedGraph(self._fn, specs, buckets, device=self.device, output_batch_dims=None,
                                   enforce_eager=enforce_eager)

    def _fn(self, embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.stage.reset()
        return self.talker.prefill(embeds, positions, self.stage)

    def capture(self) -> None:
        self.graph.capture()

    @torch.no_grad()
    def __call__(self, embeds: torch.Tensor, row: KVCache) -> torch.Tensor:
        """Prefill prompt embeds [1, T, H] into the one-row cache view `row` (reset first) -> h [1, 1, H]."""
        t = embeds.shape[1]
        positions = torch.arange(t, device=self.device)[None]
        if self.graph.eager or pick_bucket(self.graph.buckets, t) is None:
            row.reset()
            return self.talker.prefill(embeds, positions, row)
        h = self.graph.step(embeds=embeds, positions=positions)
        row.k.copy_(self.stage.k)
        row.v.copy_(self.stage.v)
        row.slot_pos.copy_(self.stage.slot_pos)
        return h
