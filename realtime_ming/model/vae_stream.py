"""Streaming AudioVAE decode for a batch of independent streams (docs/model.md §6.4).

Reproduces the official `Decoder.low_level_reconstruct(use_cache=True)` (`StreamingLinearUpsample`
one-chunk lookahead, Qwen2 KV cache, ISTFT overlap buffers): each stream's concatenated output
equals the full decode, chunk sizes included (0, 12789, 14112, …, final flush). All state lives
in an explicit `VAEStreamState`; `decode_chunk` has static shapes and no host sync, so rows at
different progress share one call. `SilenceHolder` is the per-stream host-side post-filter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .qwen2 import KVCache
from .vae import AudioVAE, ISTFTHead, overlap_add, upsample_linear

__all__ = ["VAEStreamState", "VAEChunk", "decode_chunk", "SilenceHolder"]


@dataclass
class VAEStreamState:
    """Per-row streaming state of the VAE decoder, allocated once for `batch` streams.

    A row holds its latest chunk back (the upsampler needs the next chunk's first frame) and
    emits it on the following call; `frame_pos` counts the 50 Hz frames already run through the
    backbone (= the next RoPE / cache position).
    """

    chunk_latents: int  # latents per call (the talker patch, 4)
    cache: KVCache  # decoder backbone K/V, rows addressed by absolute frame position
    held: torch.Tensor  # [B, n, H] model dtype: fc1 output of the held chunk
    left_ctx: torch.Tensor  # [B, 1, H] model dtype: frame before the held chunk (its own first frame at stream start)
    has_held: torch.Tensor  # [B] bool
    frame_pos: torch.Tensor  # [B] int64
    audio_buf: torch.Tensor  # [B, win - hop] fp32: overlap-add tail not yet complete
    env_buf: torch.Tensor  # [B, win - hop] fp32: the same for the squared-window envelope

    @classmethod
    def allocate(cls, vae: AudioVAE, batch: int, chunk_latents: int = 4, max_stream_latents: int | None = None,
                 device=None, dtype=None) -> "VAEStreamState":
        """State for `batch` streams fed `chunk_latents` latents per call (device/dtype default to the model's).

        With a sliding-window backbone the cache holds window − 1 + one call's frames; without a
        window it must hold a whole stream (`max_stream_latents`).
        """
        dec = vae.decoder
        weight = dec.fc1.weight
        device = weight.device if device is None else device
        dtype = weight.dtype if dtype is None else dtype
        bb = dec.decoder.cfg
        windows = {bb.layer_window(i) for i in range(bb.num_hidden_layers)}
        call_frames = 2 * chunk_latents * dec.patch_size
        if None in windows:
            if max_stream_latents is None:
                raise ValueError("a decoder backbone without sliding window needs max_stream_latents")
            capacity = max_stream_latents * dec.patch_size + call_frames
        else:
            capacity = max(windows) - 1 + call_frames
        h = bb.hidden_size
        buf = dec.head.n_fft - dec.head.hop
        return cls(
            chunk_latents,
            KVCache.allocate(bb, batch, capacity, device, dtype),
            torch.zeros(batch, chunk_latents, h, device=device, dtype=dtype),
            torch.zeros(batch, 1, h, device=device, dtype=dtype),
            torch.zeros(batch, device=device, dtype=torch.bool),
            torch.zeros(batch, device=device, dtype=torch.int64),
            torch.zeros(batch, buf, device=device, dtype=torch.float32),
            torch.zeros(batch, buf, device=device, dtype=torch.float32),
        )

    @property
    def batch(self) -> int:
        return self.has_held.shape[0]

    def reset_range(self, start: int, stop: int) -> None:
        """Start fresh streams in rows [start, stop) (slices: no row index to upload)."""
        for t, value in self._fresh():
            t[start:stop].fill_(value)

    def _fresh(self) -> tuple:
        """(tensor, value) of every per-row field a fresh stream starts from."""
        return ((self.cache.slot_pos, -1), (self.has_held, False), (self.frame_pos, 0), (self.audio_buf, 0.0),
                (self.env_buf, 0.0))

    def reset_rows(self, rows: torch.Tensor) -> None:
        """Start fresh streams in the rows of the [B] bool mask `rows`: masked in-place writes (no boolean
        indexing), no host sync, graph-capturable."""
        for t, value in self._fresh():
            t.masked_fill_(rows.view(-1, *[1] * (t.dim() - 1)), value)


@dataclass
class VAEChunk:
    """Audio emitted by one `decode_chunk` call: row r's samples are audio[r, :num_samples[r]]."""

    audio: torch.Tensor  # [B, max_len] fp32, 44.1 kHz, zero past num_samples
    num_samples: torch.Tensor  # [B] int64

    def rows(self) -> list[torch.Tensor]:
        """Per-row 1-D float32 CPU tensors (one device-to-host copy; host sync)."""
        audio, lengths = self.audio.cpu(), self.num_samples.tolist()
        return [audio[r, :n] for r, n in enumerate(lengths)]


def _as_row_mask(value, batch: int, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=torch.bool).expand(batch)
    return torch.full((batch,), bool(value), device=device, dtype=torch.bool)


def _frame_positions(valid: torch.Tensor, frame_pos: torch.Tensor) -> torch.Tensor:
    """Valid frames get frame_pos, frame_pos+1, … in order; padding frames the positions after them.

    Padding therefore lands in cache slots that no query can see yet and that the stream's real
    frames overwrite before reaching those positions (cache capacity ≥ window − 1 + frames per
    call), so its garbage never leaks into real outputs — unlike position −1, whose K/V would be
    scattered into slot 0.
    """
    valid_i = valid.long()
    rank_valid = valid_i.cumsum(1) - 1
    rank_pad = (1 - valid_i).cumsum(1) - 1
    num_valid = valid_i.sum(1, keepdim=True)
    return frame_pos[:, None] + torch.where(valid, rank_valid, num_valid + rank_pad)


def _emit(head: ISTFTHead, frames: torch.Tensor, valid: torch.Tensor, first_frame: torch.Tensor, last: torch.Tensor,
          state: VAEStreamState) -> VAEChunk:
    """Overlap-add the block's valid frames onto the carried tails; return what is final, keep the new tails.

    frames [B, F, win] fp32 windowed; valid [B, F]; first_frame [B]: block index of the row's first
    valid frame. Mirrors `ISTFT._buffer_process`: the stream's first 'same' trim is dropped, the last
    win − hop samples are carried unless the stream ends (then only the trailing trim is dropped).
    """
    hop, trim = head.hop, head.trim
    buf_len = state.audio_buf.shape[1]
    frames = torch.where(valid[..., None], frames, 0.0)
    win_sq = torch.where(valid[..., None], head.window_sq(), 0.0)
    y, env = overlap_add(frames, hop), overlap_add(win_sq, hop)  # [B, F·hop + buf]
    # the carried tail belongs at the first valid frame: block start, or (no held chunk) a fresh row whose tail is 0
    y[:, :buf_len] += state.audio_buf
    env[:, :buf_len] += state.env_buf

    num_valid = valid.long().sum(1)  # [B]
    end_frame = torch.where(num_valid > 0, first_frame + num_valid, 0)
    start = first_frame * hop + torch.where(state.frame_pos == 0, trim, 0)
    end = end_frame * hop + torch.where(last, buf_len - trim, 0)
    num_samples = torch.where(num_valid > 0, end - start, 0)

    max_len = frames.shape[1] * hop + buf_len - trim
    offs = torch.arange(max_len, device=y.device)
    idx = (start[:, None] + offs).clamp(max=y.shape[1] - 1)
    keep = offs < num_samples[:, None]
    audio = torch.where(keep, y.gather(1, idx) / env.gather(1, idx), 0.0)

    tail = (end_frame * hop)[:, None] + torch.arange(buf_len, device=y.device)  # unchanged tail when nothing was valid
    state.audio_buf.copy_(y.gather(1, tail))
    state.env_buf.copy_(env.gather(1, tail))
    state.frame_pos.add_(num_valid)
    return VAEChunk(audio, num_samples)


@torch.no_grad()
def decode_chunk(vae: AudioVAE, latents: torch.Tensor, state: VAEStreamState, is_last: bool | torch.Tensor,
                 active: torch.Tensor | None = None) -> VAEChunk:
    """Feed each row its next `chunk_latents` latents; returns the audio that became final.

    latents [B, n, latent]; is_last: bool or [B] bool (row's stream ends with this chunk: the
    held and the current chunk are flushed and the row is reset); active: [B] bool, rows with
    False are left untouched and emit nothing (default all True). `is_last=False` as a Python bool
    runs only the held chunk through the backbone (4n frames); otherwise the block has 8n frames.
    Sync-free and graph-capturable with tensor `is_last` / `active`; state is updated in place.
    """
    dec = vae.decoder
    b, n, _ = latents.shape
    if n != state.chunk_latents or b != state.batch:
        raise ValueError(f"latents {tuple(latents.shape)} do not match the state ({state.batch} rows × {state.chunk_latents})")
    device = latents.device
    may_end = not (isinstance(is_last, bool) and not is_last)
    active = _as_row_mask(True if active is None else active, b, device)
    last = _as_row_mask(is_last, b, device) & active
    scale = dec.patch_size
    chunk_frames = n * scale

    x = dec.fc1(latents.to(dec.fc1.weight.dtype))  # [B, n, H]
    has_held = state.has_held
    # held chunk: its successor's first frame is now known (StreamingLinearUpsample lookahead)
    parts = [upsample_linear(state.held, state.left_ctx, x[:, :1], scale)]
    valid_parts = [has_held & active]
    left_cur = torch.where(has_held[:, None, None], state.held[:, -1:], x[:, :1])
    if may_end:
        parts.append(upsample_linear(x, left_cur, x[:, -1:], scale))  # flushed only in `last` rows
        valid_parts.append(last)
    block = torch.cat(parts, dim=1)  # [B, F, H]
    valid = torch.cat([v[:, None].expand(b, chunk_frames) for v in valid_parts], dim=1)  # [B, F]
    pos = _frame_positions(valid, state.frame_pos)
    frames = dec.head.frames(dec.decoder(block, pos, state.cache))  # [B, F, win] fp32
    first_frame = torch.where(valid_parts[0], 0, chunk_frames)
    out = _emit(dec.head, frames, valid, first_frame, last, state)

    state.left_ctx.copy_(torch.where(active[:, None, None], left_cur, state.left_ctx))
    state.held.copy_(torch.where(active[:, None, None], x, state.held))
    state.has_held.logical_or_(active)
    state.reset_rows(last)
    return out

class SilenceHolder:
    """`BailingTalker2.silence_holder` for one stream (docs/model.md §6.4), on 1-D fp32 host tensors.

    Audio is scored in 0.1 s frames (mean |x|, silent when ≤ 1e-3); a partial frame waits for the
    next chunk. A chunk without any loud frame is withheld and emitted in front of the next loud
    audio; on the last chunk at most 0.3 s of silence after the last loud frame is kept.
    Reference quirk reproduced: in a chunk with loud frames, the silence after its last loud frame
    is dropped (the reference meant to withhold it, but re-holds the tail of its *concatenated*
    output, which is empty when nothing was held). Deviation: when something was held, that
    re-held tail is audio already emitted and the reference would emit it a second time later;
    here it is dropped as well. Data-dependent shapes (host sync): run it on the emitted audio.
    """

    def __init__(self, sample_rate_hz: int = 44100, frame_s: float = 0.1, threshold: float = 1e-3,
                 last_silence_s: float = 0.3):
        self.frame_len = int(sample_rate_hz * frame_s)
        self.threshold = threshold
        self.max_tail = int(sample_rate_hz * last_silence_s)
        self._held: list[torch.Tensor] = []  # whole silent chunks (multiples of frame_len)
        self._partial: torch.Tensor | None = None  # < frame_len samples not scored yet

    def reset(self) -> None:
        self._held, self._partial = [], None

    def _flush(self, pending: list[torch.Tensor]) -> torch.Tensor:
        out = torch.cat(self._held + pending)[: self.max_tail]
        self.reset()
        return out

    def push(self, audio: torch.Tensor, is_last: bool) -> torch.Tensor:
        """Filter the next decoded chunk [n] of this stream; returns the samples to emit now.

        After `is_last` the holder is reset for a new stream.
        """
        if self._partial is not None:
            audio = torch.cat((self._partial, audio))
            self._partial = None
        num_frames = audio.numel() // self.frame_len
        whole = num_frames * self.frame_len
        partial = audio[whole:] if whole < audio.numel() else None
        audio = audio[:whole]
        if num_frames == 0:
            if is_last:
                return self._flush([partial] if partial is not None else [])
            self._partial = partial
            return audio
        scores = audio.view(num_frames, self.frame_len).abs().mean(dim=1)
        loud = (scores > self.threshold).nonzero()
        if loud.numel() == 0:
            if is_last:
                return self._flush([audio] + ([partial] if partial is not None else []))
            self._held.append(audio)
            self._partial = partial
            return audio[:0]
        keep = (int(loud[-1]) + 1) * self.frame_len + (self.max_tail if is_last else 0)
        out = torch.cat(self._held + [audio[:keep]])
        self._held = []
        self._partial = partial
        if is_last:
            self.reset()  # the reference never emits the final partial frame
        return out
