"""Audio encoder stage: [MING] `WhisperAudioEncoder` + `linear_proj_audio` (docs/model.md §2.2–2.3).

log-mel [B, T, 128] → encoder [B, (T−1)//2+1, n_state] → projector [B, T2, hidden], L2-normalised.
`encode_wrapped` is [MING] `encode_audio_segments`, quirk included: several clips are zero-padded
to the longest and encoded without an attention mask (§2.1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .kernels.sdpa import attention_any_length
from .config import AudioEncoderConfig

__all__ = [
    "whisper_sinusoids",
    "encoder_output_lengths",
    "projector_output_lengths",
    "audio_token_lengths",
    "max_mel_frames",
    "WhisperEncoder",
    "AudioProjector",
    "WrappedAudioEmbeddings",
    "unwrap_feats",
    "wrap_feats",
    "encode_wrapped",
]

_LN_EPS = 1e-5


def whisper_sinusoids(length: int, channels: int, device=None) -> torch.Tensor:
    """Whisper `sinusoids(length, channels)`: [length, channels] fp32, [sin | cos] halves.

    Timescales exp(−ln(10000)/(channels/2 − 1) · k), k < channels/2 (docs/model.md §2.2 step 3).
    """
    if channels % 2:
        raise ValueError(f"channels must be even, got {channels}")
    half = channels // 2
    increment = math.log(10000) / (half - 1)
    inv_timescales = torch.exp(-increment * torch.arange(half, device=device, dtype=torch.float32))
    scaled = torch.arange(length, device=device, dtype=torch.float32)[:, None] * inv_timescales[None, :]
    return torch.cat([scaled.sin(), scaled.cos()], dim=1)


def _conv_out(lengths, kernel: int, stride: int):
    # Conv1d with padding kernel // 2 (both encoder conv2 and the projector conv)
    return (lengths - kernel + 2 * (kernel // 2)) // stride + 1


def encoder_output_lengths(mel_lengths):
    """Encoder frames per clip: (T − 1)//2 + 1 (conv2 stride 2). Works on ints and int tensors."""
    return _conv_out(mel_lengths, 3, 2)


def projector_output_lengths(encoder_lengths, cfg: AudioEncoderConfig):
    """Audio tokens per clip from encoder frames (projector Conv1d, `ds_kernel_size`/`ds_stride`)."""
    return _conv_out(encoder_lengths, cfg.ds_kernel_size, cfg.ds_stride)


def audio_token_lengths(mel_lengths, cfg: AudioEncoderConfig):
    """Audio tokens per clip from mel frames (= placeholder count): 150 mel frames → 38 tokens."""
    return projector_output_lengths(encoder_output_lengths(mel_lengths), cfg)


def max_mel_frames(cfg: AudioEncoderConfig) -> int:
    """The encoder's window in mel frames: the longest clip whose encoder output (conv2 stride 2) fits
    the `n_ctx` positional embeddings (1500 positions -> 3000 frames, 30 s at a 10 ms hop)."""
    n_ctx = cfg.whisper_encoder_config.n_ctx
    frames = 2 * n_ctx
    while encoder_output_lengths(frames) > n_ctx:  # the inverse of the conv formula, checked
        frames -= 1
    return frames


def _conv1d_as_linear(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """`conv` on channel-last x [B, T, C] → [B, T_out, out], as a Linear over unfolded k-frame windows.

    Same math as Conv1d, but a plain matmul: cuDNN convolutions default to TF32 on GPU
    (`torch.backends.cudnn.allow_tf32`), which moves fp32 results by ~1e-4 off the reference.
    """
    k, stride, pad = conv.kernel_size[0], conv.stride[0], conv.padding[0]
    windows = F.pad(x, (0, 0, pad, pad)).unfold(1, k, stride)  # [B, T_out, C, k]
    return F.linear(windows.flatten(2), conv.weight.flatten(1), conv.bias)


class _FP32LayerNorm(nn.LayerNorm):
    """Whisper `LayerNorm`: normalise in fp32, cast back to the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), self.bias.float(),
                            self.eps).to(x.dtype)


class _WhisperAttention(nn.Module):
    """Whisper `MultiHeadAttention` (self-attention, no mask): `key` has no bias."""

    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (proj(x).view(b, t, self.n_head, -1).transpose(1, 2) for proj in (self.query, self.key, self.value))
        out = attention_any_length(q, k, v, attn_mask=key_mask)  # non-causal; scale 1/sqrt(head_dim)
        return self.out(out.transpose(1, 2).reshape(b, t, c))


class _WhisperBlock(nn.Module):
    """Whisper `ResidualAttentionBlock` (encoder: no cross-attention), pre-LN."""

    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.attn = _WhisperAttention(n_state, n_head)
        self.attn_ln = _FP32LayerNorm(n_state, eps=_LN_EPS)
        self.mlp = nn.Sequential(nn.Linear(n_state, 4 * n_state), nn.GELU(), nn.Linear(4 * n_state, n_state))
        self.mlp_ln = _FP32LayerNorm(n_state, eps=_LN_EPS)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_ln(x), key_mask)
        return x + self.mlp(self.mlp_ln(x))


class WhisperEncoder(nn.Module):
    """Ming's `WhisperAudioEncoder` (openai-whisper `AudioEncoder` without 30 s padding), §2.2.

    Checkpoint prefix `audio.`. `positional_embedding` [n_ctx, n_state] is a persistent buffer
    (stored in the checkpoint; `init_buffers` recomputes the sinusoids).
    """

    def __init__(self, cfg: AudioEncoderConfig):
        super().__init__()
        w = cfg.whisper_encoder_config
        self.n_ctx, self.n_state = w.n_ctx, w.n_state
        self.conv1 = nn.Conv1d(w.n_mels, w.n_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(w.n_state, w.n_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", torch.empty(w.n_ctx, w.n_state), persistent=True)
        self.blocks = nn.ModuleList(_WhisperBlock(w.n_state, w.n_head) for _ in range(w.n_layer))
        self.ln_post = _FP32LayerNorm(w.n_state, eps=_LN_EPS)

    def init_buffers(self) -> None:
        buf = self.positional_embedding
        self.positional_embedding = whisper_sinusoids(self.n_ctx, self.n_state, buf.device).to(buf.dtype)

    def forward(self, mel: torch.Tensor, mel_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """mel [B, T, n_mels] → [B, (T−1)//2 + 1, n_state], in the module's dtype.

        Without `mel_lengths` every row is attended in full (no mask): padded rows see their padding,
        as in the reference. With `mel_lengths` [B] (int64, on mel's device) each row is a clip of that
        many frames zero-padded to T, computed as if alone at its own length: frames past it are zeroed
        before each conv, masked out of attention, and zero in the output (the projector's conv then
        pads with zeros as at the exact length). Static shapes, no host sync: the CUDA-graphed path.
        Raises ValueError when the encoder output would exceed `n_ctx` positions.
        """
        x = mel.to(self.conv1.weight.dtype)
        keep = key_mask = None
        if mel_lengths is not None:
            x = x * _frames_kept(mel_lengths, x.shape[1]).to(x.dtype)
        x = F.gelu(_conv1d_as_linear(x, self.conv1))
        if mel_lengths is not None:  # the exact-length conv2 sees zero padding right after the clip
            x = x * _frames_kept(mel_lengths, x.shape[1]).to(x.dtype)
        x = F.gelu(_conv1d_as_linear(x, self.conv2))
        if x.shape[1] > self.n_ctx:
            raise ValueError(f"audio too long: {x.shape[1]} encoder frames > n_ctx {self.n_ctx}")
        x = (x + self.positional_embedding[: x.shape[1]]).to(x.dtype)
        if mel_lengths is not None:
            keep = _frames_kept(encoder_output_lengths(mel_lengths), x.shape[1])  # [B, T1, 1]
            key_mask = keep[:, None, None, :, 0]  # [B, 1, 1, T1]: attend to the clip's own frames only
        for block in self.blocks:
            x = block(x, key_mask)
        x = self.ln_post(x)
        return x if keep is None else x * keep.to(x.dtype)


def _frames_kept(lengths: torch.Tensor, t: int) -> torch.Tensor:
    """[B, t, 1] bool: frame index < the row's length."""
    return (torch.arange(t, device=lengths.device)[None, :] < lengths[:, None])[..., None]


class AudioProjector(nn.Module):
    """`linear_proj_audio` (§2.3): Conv1d(k, stride, pad k//2) → GELU → Linear, then L2 norm.

    Checkpoint prefix `linear_proj_audio.`; the submodules are named `0` (Conv1d) and `3`
    (Linear) like the official `nn.Sequential` (1 and 4 were transposes, 2 the GELU).
    """

    def __init__(self, cfg: AudioEncoderConfig, hidden_size: int):
        super().__init__()
        n_state = cfg.whisper_encoder_config.n_state
        k = cfg.ds_kernel_size
        self.normalize = cfg.norm_query_embeds
        self.kernel_size, self.stride = k, cfg.ds_stride
        self.add_module("0", nn.Conv1d(n_state, hidden_size, kernel_size=k, stride=cfg.ds_stride, padding=k // 2))
        self.add_module("3", nn.Linear(hidden_size, hidden_size))

    def output_lengths(self, encoder_lengths):
        """Tokens from encoder frames (ints or int tensors): (T1 − k + 2·(k//2))//stride + 1."""
        return _conv_out(encoder_lengths, self.kernel_size, self.stride)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder output [B, T1, n_state] → [B, T2, hidden] before the L2 normalisation."""
        conv, linear = self._modules["0"], self._modules["3"]
        return linear(F.gelu(_conv1d_as_linear(x, conv)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T1, n_state] → [B, T2, hidden], unit-norm per token when `norm_query_embeds`."""
        y = self.project(x)
        return F.normalize(y, dim=-1) if self.normalize else y


def unwrap_feats(feats: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Wrapped [B, ΣT, C] with per-row clip lengths [B, N] (0 = no clip) → [n_clips, T_max, C] zero-padded.

    Host-side (reads `lengths`); clips are taken row by row, left to right, stopping at the first 0.
    """
    clips, clip_lengths = [], []
    for row, row_lengths in enumerate(lengths.tolist()):
        start = 0
        for n in row_lengths:
            if n == 0:
                break
            clips.append(feats[row, start:start + n])
            clip_lengths.append(n)
            start += n
    if not clips:
        raise ValueError("no audio clip: every length is 0")
    return torch.nn.utils.rnn.pad_sequence(clips, batch_first=True), clip_lengths


def wrap_feats(clips: torch.Tensor, clip_lengths: list[int], lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `unwrap_feats` with new per-clip lengths: → ([B, max ΣT', C] zero-padded, [B, N] int64).

    `lengths` [B, N] only decides how many clips belong to each row (up to its first 0).
    """
    rows, row_lengths, i = [], [], 0
    for row in lengths.tolist():
        count = next((j for j, n in enumerate(row) if n == 0), len(row))
        rows.append(torch.cat([clips[i + j, : clip_lengths[i + j]] for j in range(count)]))
        row_lengths.append(clip_lengths[i:i + count] + [0] * (len(row) - count))
        i += count
    padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    return padded, torch.tensor(row_lengths, dtype=torch.long, device=lengths.device)


@dataclass(frozen=True)
class WrappedAudioEmbeddings:
    """Audio embeddings in the wrapped layout, ready to splice into the thinker prompt."""

    embeds: torch.Tensor  # [B, max Σ tokens, hidden], unit-norm rows (zeros past each row's end)
    lengths: torch.Tensor  # [B, N] int64 tokens per clip, 0 = no clip


def encode_wrapped(
    encoder: WhisperEncoder,
    projector: AudioProjector,
    feats: torch.Tensor,
    lengths: torch.Tensor,
    *,
    per_clip: bool = False,
) -> WrappedAudioEmbeddings:
    """Official `extract_audio_feature` on wrapped mel features [B, ΣT, n_mels] with lengths [B, N].

    Default (reference behaviour, §2.1): all clips are batched zero-padded to the longest and
    encoded and projected WITHOUT a mask, so a shorter clip's embeddings depend on the padding.
    `per_clip=True` (off by default; not the reference) encodes every clip alone at its own
    length, so each clip's result equals its single-clip encoding. Embeddings are returned in
    `feats.dtype`, like the reference. Host-side (reads `lengths`); not for per-step use.
    """
    clips, mel_lengths = unwrap_feats(feats, lengths)
    token_lengths = [projector.output_lengths(encoder_output_lengths(n)) for n in mel_lengths]
    if per_clip:
        parts = [projector(encoder(clips[i:i + 1, :n])) for i, n in enumerate(mel_lengths)]
        width = max(p.shape[1] for p in parts)
        projected = torch.cat([F.pad(p, (0, 0, 0, width - p.shape[1])) for p in parts])
    else:
        projected = projector(encoder(clips))
    embeds, out_lengths = wrap_feats(projected, token_lengths, lengths)
    return WrappedAudioEmbeddings(embeds.to(feats.dtype), out_lengths)

