"""Thinker mixed step: the decode rows and a prefill chunk in ONE forward, CUDA-graphed per token bucket.

A step that decodes rows and also prefills a chunk used to run two forwards, each reading every MoE
expert its tokens chose -- the decode rows' experts once, the chunk's (nearly all of them) again. The mixed step
packs both into one batch of one-token rows: every decode row is a row, and so is every token of the chunk
(packed, no padding between prompts), each with its own slot, cache position, rotary position and router masks.
Within each layer the rows' K/V are written first and each row then attends to its slot's indices 0..its
position (the one-token decode attention, read in place), so a chunk token sees the chunk tokens before it:
the same causal prefill. The MoE runs once over all the step's tokens. Logits are computed only for the rows
that need one (`pick`: a decode row, or the last token of a prompt the chunk completes).

One graph per token bucket (rows padded with cache position -1: they write the sink column, their outputs are
dropped); a chunk is packed to fit the largest bucket beside the decode rows (`Scheduler.prefill_packed`).
Graphed only where the decode attention reads each row's own length (CUDA with the Triton kernels); eager
elsewhere (CPU, `enforce_eager`), with attention over the first `eager_kv_len` positions. On a tensor-parallel
group every rank builds the same mixer (`tp.py`).

The inputs travel as one int64 tensor of MIXED_FIELDS rows (one H2D copy, one broadcast under TP), the
prefill embeddings and the pick list.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from .graphs import BucketedGraph, GraphInput, pick_bucket, upload
from .thinker_decode import eager_kv_len

__all__ = ["MIXED_FIELDS", "ThinkerMixer", "mixed_buckets", "pack_mixed"]

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]

# rows of the int64 inputs: token id (decode rows), token flag (1: embed `tok`, 0: take `embeds`), cache position
# (-1 = padding), KV slot, rotary position (3 axes), image router, audio router
MIXED_FIELDS = ("tok", "is_tok", "pos", "slot", "rot_t", "rot_h", "rot_w", "image", "audio")


def mixed_buckets(largest: int, smallest: int = 32) -> tuple[int, ...]:
    """Token buckets of the mixed step: powers of two from `smallest`, their midpoints above 128, then `largest`."""
    out, k = [], smallest
    while k < largest:
        out.append(k)
        if k >= 128 and k + k // 2 < largest:
            out.append(k + k // 2)
        k *= 2
    out.append(largest)
    return tuple(out)


class ThinkerMixer:
    """`step(needed, ints, embeds, pick)` -> fp32 logits [K, V] of the picked rows (graph memory when graphed).

    ints [len(MIXED_FIELDS), N] int64 (see MIXED_FIELDS); embeds [N, D] model dtype (rows with is_tok 1 ignore
    theirs); pick [K] int64 row indices (K <= `picks`); needed = the largest cache position + 1 (eager reads).
    """

    def __init__(self, thinker, cache, token_buckets: Sequence[int], *, picks: int, dtype: torch.dtype,
                 device: torch.device | str, enforce_eager: bool = False):
        self.thinker, self.cache, self.picks = thinker, cache, int(picks)
        self.device = torch.device(device)
        self.buckets = tuple(sorted({int(b) for b in token_buckets}))
        if not self.buckets or self.buckets[0] < 1 or self.picks < 1:
            raise ValueError("a mixed step needs positive token buckets and picks")
        self.eager = (enforce_eager or self.device.type != "cuda"
                      or not thinker.decode_reads_exact_lengths(self.device))
        top = self.buckets[-1]
        specs = {"ints": GraphInput((len(MIXED_FIELDS), top), torch.int64, batch_dim=1, pad=-1),
                 "embeds": GraphInput((top, thinker.cfg.hidden_size), dtype),
                 "pick": GraphInput((self.picks,), torch.int64, batch_dim=None)}
        self.graph = BucketedGraph(self._fn(cache.capacity), specs, self.buckets, device=self.device,
                                   enforce_eager=self.eager, output_batch_dims=None)

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1]

    def _fn(self, kv_len: int):
        thinker, cache = self.thinker, self.cache

        def step(ints, embeds, pick):
            tok, is_tok, pos, slot = ints[0:1].T, ints[1:2].T != 0, ints[2:3].T, ints[3].clamp(min=0)  # [N, 1]...
            rotary = ints[4:7].unsqueeze(-1)  # [3, N, 1]
            x = torch.where(is_tok.unsqueeze(-1), thinker.embed(tok), embeds.unsqueeze(1))  # [N, 1, D]
            hidden = thinker(x, rotary, cache=cache, slots=slot, cache_positions=pos, kv_len=kv_len,
                             image_mask=ints[7:8].T != 0, audio_mask=ints[8:9].T != 0)
            return thinker.logits(hidden[:, -1].index_select(0, pick))

        return step

    @property
    def graphed(self) -> bool:
        return self.graph.graphed

    def release(self) -> None:
        """Free the captured graphs (see `BucketedGraph.release`); later steps run eager."""
        self.graph.release()
        self.eager = True

    def capture(self, progress: Progress | None = None) -> None:
        """Capture every token bucket, largest first (no-op when eager): padding rows only, sink writes."""
        if self.eager:
            return
        t0 = time.monotonic()
        if progress is not None:
            progress("capturing thinker mixed-step graphs", 0, 1)
        self.graph.capture()
        if progress is not None:
            progress("capturing thinker mixed-step graphs", 1, 1)
        log.info("thinker mixed step: %d CUDA graphs (tokens %s) in %.1f s", len(self.buckets), list(self.buckets),
                 time.monotonic() - t0)

    @torch.no_grad()
    def step(self, needed: int, ints: torch.Tensor, embeds: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
        k = pick.shape[0]
        if k > self.picks:
            raise ValueError(f"{k} picked rows exceed the mixer's {self.picks}")
        if self.eager or pick_bucket(self.buckets, ints.shape[1]) is None:
            return self._fn(eager_kv_len(needed, self.cache.capacity))(ints, embeds, pick)
        if k < self.picks:  # padding picks read row 0; their logits are dropped
            pick = torch.cat((pick, pick.new_zeros(self.picks - k)))
        return self.graph.step(ints=ints, embeds=embeds, pick=pick)[:k]


def pack_mixed(decoding: list, chosen: list, *, device: torch.device, dtype: torch.dtype,
               hidden: int) -> tuple[int, torch.Tensor, torch.Tensor, list[int]]:
    """The mixed step's inputs for decode rows `decoding` (`scheduler.Row`s with a next token) and prefill chunks
    `chosen` ((row, start, end)): -> (needed, ints, embeds, last) where `last[i]` is the row index of chunk i's
    last token. Decode rows come first, then each chunk's tokens in order. Queued without a host sync."""
    n_dec = len(decoding)
    positions = [len(r.slot.ids) for r in decoding]
    head = [[r.next_token for r in decoding], [1] * n_dec, positions, [r.slot.index for r in decoding]]
    head += [[p + r.rope_delta for p, r in zip(positions, decoding)]] * 3 + [[0] * n_dec] * 2
    parts = [upload(head, torch.int64, device)] if n_dec else []
    embeds = [torch.zeros(n_dec, hidden, dtype=dtype, device=device)]
    last, at, needed = [], n_dec, max(positions, default=0) + 1
    for row, start, end in chosen:
        prep, n = row.prefill, end - start
        flags = torch.zeros(2, n, dtype=torch.int64, device=device)  # tok, is_tok: 0
        slot = torch.full((1, n), row.slot.index, dtype=torch.int64, device=device)
        masks = [torch.zeros(1, n, dtype=torch.int64, device=device) if m is None else m[:, start:end].long()
                 for m in (prep.image_mask, prep.audio_mask)]
        parts.append(torch.cat([flags, prep.cache_positions[:, start:end], slot, prep.position_ids[:, 0, start:end],
                                *masks]))
        embeds.append(prep.inputs_embeds[0, start:end])
        at += n
        last.append(at - 1)
        needed = max(needed, len(row.slot.ids) + n)  # the slot holds its tokens before `start`
    return needed, torch.cat(parts, dim=1), torch.cat(embeds), last
