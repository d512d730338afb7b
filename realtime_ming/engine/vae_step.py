"""Streaming AudioVAE chunk decode of the talker's active rows, CUDA-graphed per batch bucket.

Each talker step hands every active stream 4 new latents; `decode_chunk` turns them into the audio
that became final. Graphed (CUDA, graphs on): two graph families over rows 0..B-1 of the runner's
`VAEStreamState`, padding rows inactive (untouched, silent):
  * hold  - no stream ends this step: only the held chunk runs through the backbone (4n frames);
  * flush - some streams end: their held and current chunks are flushed and their rows reset
    (8n frames), the other rows emit their held chunk as in `hold`.
Eager (CPU, enforce_eager, more rows than the largest bucket): the ending rows are flushed in a call
of their own on a copy of their state, so the others keep the half-size held block.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from ..model.qwen2 import KVCache
from ..model.vae import AudioVAE
from ..model.vae_stream import VAEStreamState, decode_chunk
from .graphs import BucketedGraph, GraphInput, pick_bucket, upload

__all__ = ["VAEStepper"]

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]


def state_rows(st: VAEStreamState, rows: int) -> VAEStreamState:
    """Rows 0..rows-1 of `st` as views (`decode_chunk` updates them in place)."""
    if rows == st.batch:
        return st
    return VAEStreamState(st.chunk_latents, st.cache.rows(0, rows), st.held[:rows], st.left_ctx[:rows],
                          st.has_held[:rows], st.frame_pos[:rows], st.audio_buf[:rows], st.env_buf[:rows])


def _state_gather(st: VAEStreamState, idx: torch.Tensor) -> VAEStreamState:
    """A copy of rows `idx` of `st` (decode_chunk on it leaves `st` unchanged)."""
    cache = KVCache(st.cache.k[:, idx], st.cache.v[:, idx], st.cache.slot_pos[idx])
    return VAEStreamState(st.chunk_latents, cache, st.held[idx], st.left_ctx[idx], st.has_held[idx],
                          st.frame_pos[idx], st.audio_buf[idx], st.env_buf[idx])


class VAEStepper:
    """`__call__(latents [n, P, C], last: list[bool])` -> per-row 1-D float32 CPU audio (one D2H copy)."""

    def __init__(self, vae: AudioVAE, state: VAEStreamState, buckets: Sequence[int], *, device: torch.device | str,
                 enforce_eager: bool = False):
        self.vae, self.state = vae, state
        self.device = torch.device(device)
        buckets = sorted({min(int(b), state.batch) for b in buckets})
        top, chunk = max(buckets), state.chunk_latents
        dtype = vae.decoder.fc1.weight.dtype
        lat = GraphInput((top, chunk, vae.cfg.dec_kwargs.latent_dim), dtype)  # [B, P, C] new latents
        inactive = GraphInput((top,), torch.bool, pad=False)  # padding rows: untouched, silent
        self._hold = BucketedGraph(self._hold_fn, {"lat": lat, "active": inactive}, buckets, device=self.device,
                                   enforce_eager=enforce_eager)
        self._flush = BucketedGraph(self._flush_fn, {"lat": lat, "last": inactive, "active": inactive}, buckets,
                                    device=self.device, enforce_eager=enforce_eager)
        self.eager = self._hold.eager
        self._all_rows = torch.ones(top, dtype=torch.bool, device=self.device)  # `active` when every row takes part

    def _hold_fn(self, lat, active):
        out = decode_chunk(self.vae, lat, state_rows(self.state, lat.shape[0]), False, active)
        return out.audio, out.num_samples

    def _flush_fn(self, lat, last, active):
        out = decode_chunk(self.vae, lat, state_rows(self.state, lat.shape[0]), last, active)
        return out.audio, out.num_samples

    @property
    def graphed(self) -> bool:
        return self._hold.graphed and self._flush.graphed

    def capture(self, progress: Progress | None = None) -> None:
        """Capture both graph families (inputs all padding: the state is left untouched)."""
        if self.eager or self.graphed:
            return
        t0 = time.monotonic()
        for i, (name, graph) in enumerate((("hold", self._hold), ("flush", self._flush))):
            if progress is not None:
                progress(f"capturing VAE chunk graphs ({name})", i, 2)
            graph.capture()
        if progress is not None:
            progress("capturing VAE chunk graphs", 2, 2)
        log.info("VAE chunk: %d CUDA graphs (batch %s) in %.1f s", 2 * len(self._hold.buckets),
                 list(self._hold.buckets), time.monotonic() - t0)

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor, last: list[bool], active: list[bool] | None = None) -> list[torch.Tensor]:
        """`active` (default all): rows left out keep their state and give no audio (a pipelined talker's rows
        that did not take this step)."""
        n = len(last)
        latents = latents.to(self.device, self._hold.specs["lat"].dtype)
        active = [True] * n if active is None else list(active)
        last = [end and on for end, on in zip(last, active)]
        if self.eager or pick_bucket(self._hold.buckets, n) is None:
            return self._eager(latents, last, active)
        # all rows (no upload, no fill) unless a pipelined step left some out
        on = self._all_rows[:n] if all(active) else upload(active, torch.bool, self.device)
        if any(last):
            audio, num = self._flush.step(lat=latents, last=upload(last, torch.bool, self.device), active=on)
        else:
            audio, num = self._hold.step(lat=latents, active=on)
        audio, lengths = audio.cpu(), num.tolist()  # the host copy (graph memory is reused next step)
        return [audio[r, :k] for r, k in enumerate(lengths)]

    def _eager(self, latents: torch.Tensor, last: list[bool], active: list[bool]) -> list[torch.Tensor]:
        n = len(last)
        ending = [i for i, end in enumerate(last) if end]
        rows = [torch.zeros(0)] * n
        going_on = [on and not end for on, end in zip(active, last)]
        if any(going_on):
            mask = torch.tensor(going_on, device=self.device)
            out = decode_chunk(self.vae, latents, state_rows(self.state, n), False, mask).rows()
            rows = [pcm if go else torch.zeros(0) for pcm, go in zip(out, going_on)]
        if ending:
            idx = torch.tensor(ending, device=self.device)
            for i, pcm in zip(ending, decode_chunk(self.vae, latents[idx], _state_gather(self.state, idx), True).rows()):
                rows[i] = pcm
        return rows
