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
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..model.qwen2 import KVCache
from ..model.talker import Talker, VoicePrompt, history_update
from .graphs import BucketedGraph, GraphInput, pick_bucket

__all__ = ["PROMPT_BUCKETS", "PromptHead", "TalkerPrefiller", "TalkerStepper", "VoiceHeadCache", "prefill_buckets",
           "talker_step"]

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


PROMPT_BUCKETS = (32, 64, 96, 128, 192, 256)  # CUDA-graph prompt lengths of a new stream (`prefill_buckets`)


def prefill_buckets(buckets: Sequence[int], capacity: int, longest_prompt: int) -> tuple[int, ...]:
    """The prefill graph widths: `buckets` capped at `capacity`, plus `longest_prompt` (rounded up to a multiple
    of 32, capped at `capacity`) when the largest bucket is shorter, so the longest prompt the runner
    prefills (a voice prompt at its budget plus the reply text: `TalkerRunner`'s split threshold) replays a
    graph instead of running eager."""
    widths = {min(int(b), capacity) for b in buckets}
    if widths and max(widths) < longest_prompt:
        widths.add(min(-(-longest_prompt // 32) * 32, capacity))
    return tuple(sorted(widths))


@dataclass(frozen=True)
class PromptHead:
    """The K/V of a voice's fixed talker-prompt head: every token before the reply text (system, user,
    instruction, speaker slot, ` Text input:`, the voice's transcript). The talker LM is causal, so these
    K/V do not depend on the text after them: a job in this voice loads them and prefills the rest."""

    voice: weakref.ref  # the VoicePrompt they were computed with (its speaker embedding is in the head)
    prompt_text: str
    ids: tuple[int, ...]
    k: torch.Tensor  # [layers, 1, kv_heads, len(ids), head_dim]
    v: torch.Tensor

    def shared(self, ids: Sequence[int]) -> int:
        """How many leading tokens of a prompt's `ids` the head holds."""
        n = 0
        for a, b in zip(self.ids, ids):
            if a != b:
                break
            n += 1
        return n


class VoiceHeadCache:
    """`PromptHead`s of the last `size` voices used (LRU; 0 = off). Keys are the voices' identities: a
    replaced or dropped voice's entry is never matched (its weak reference is dead or another object)."""

    def __init__(self, size: int):
        self.size = size
        self._heads: OrderedDict[int, PromptHead] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._heads)

    def get(self, voice: VoicePrompt, prompt_text: str) -> PromptHead | None:
        head = self._heads.get(id(voice))
        if head is None or head.voice() is not voice or head.prompt_text != prompt_text:
            self.misses += 1
            return None
        self._heads.move_to_end(id(voice))
        self.hits += 1
        return head

    def put(self, voice: VoicePrompt, prompt_text: str, ids: Sequence[int], row: KVCache) -> None:
        """Keep the first len(ids) positions of `row` (just prefilled with a prompt starting with `ids`)."""
        if self.size <= 0 or not ids:
            return
        n = len(ids)
        if n > row.capacity:  # positions 0..n-1 sit in slots 0..n-1 only while none wrapped around the ring
            raise ValueError(f"a {n}-token prompt head does not fit a {row.capacity}-slot talker cache")
        k, v = row.k[:, :1, :, :n].clone(), row.v[:, :1, :, :n].clone()
        self._heads[id(voice)] = PromptHead(weakref.ref(voice), prompt_text, tuple(ids), k, v)
        self._heads.move_to_end(id(voice))
        while len(self._heads) > self.size:
            self._heads.popitem(last=False)


class TalkerPrefiller:
    """Talker-LM prefill of one new stream's prompt, CUDA-graphed per prompt-length bucket.

    The graph prefills a one-row staging cache (the prompt padded with position -1: its K/V go to
    the sink slot); the caller's row then receives a copy of that row (~3 MB). Eager (CPU,
    enforce_eager, longer prompts): `Talker.prefill` straight into the caller's row. A voice's cached
    `PromptHead` is loaded into the target first, so only the tokens after it are prefilled (a shorter
    bucket).
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
        return self.talker.prefill(embeds, positions, self.stage)

    def capture(self) -> None:
        self.graph.capture()

    @torch.no_grad()
    def __call__(self, embeds: torch.Tensor, row: KVCache, head: PromptHead | None = None,
                 start: int = 0) -> torch.Tensor:
        """Prefill prompt embeds [1, T, H] into the one-row cache view `row` (reset first) -> h [1, 1, H].

        With `head`, its first `start` (< T) positions are loaded instead of computed: only embeds[:, start:]
        run through the LM (same K/V and h: the LM is causal).
        """
        t = embeds.shape[1]
        if not 0 <= start < t or (start and head is None):
            raise ValueError(f"prefill start {start} outside a {t}-token prompt (or no head)")
        if t > row.capacity:  # a window-less LM: a longer prompt would wrap the ring and overwrite its own K/V
            raise ValueError(f"a {t}-token talker prompt does not fit a {row.capacity}-slot cache")
        positions = torch.arange(start, t, device=self.device)[None]
        graphed = not self.graph.eager and pick_bucket(self.graph.buckets, t - start) is not None
        target = self.stage if graphed else row
        target.reset()
        if start:
            target.k[:, :1, :, :start].copy_(head.k[..., :start, :])
            target.v[:, :1, :, :start].copy_(head.v[..., :start, :])
            target.slot_pos[:1, :start].copy_(torch.arange(start, device=self.device)[None])
        if not graphed:
            return self.talker.prefill(embeds[:, start:], positions, row)
        h = self.graph.step(embeds=embeds[:, start:], positions=positions)
        row.k.copy_(self.stage.k)
        row.v.copy_(self.stage.v)
        row.slot_pos.copy_(self.stage.slot_pos)
        return h
