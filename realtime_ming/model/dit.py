"""Talker transformers: the CFM velocity network `DiT` (`cfm.model`) and the `Aggregator`.

Reproduces ming_model.md §5.5 and §5.7 ([MING] `talker_module/{dit,modules,aggregator}.py`:
`DiT`, `DiTBlock`, `Attention`, `FeedForward`, `FinalLayer`, `TimestepEmbedder`, `CondEmbedder`,
`Aggregator`) with x-transformers 2.15.2 `RotaryEmbedding` (interleaved / GPT-J pairing).
Both networks share the block stack; every input is batched (each row its own condition).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import DiTConfig
from .layers import RMSNorm

__all__ = [
    "InterleavedRotary",
    "apply_interleaved_rotary",
    "DiTBlock",
    "FinalLayer",
    "TimestepEmbedder",
    "CondEmbedder",
    "DiT",
    "Aggregator",
]

# The talker RMSNorm (`talker_module/modules.py`) on torch >= 2.10 takes its manual path:
# variance of x in fp32, x * rsqrt(var + eps), cast to the weight dtype, times the weight —
# the same arithmetic as `layers.RMSNorm`, which is therefore reused (eps fixed at 1e-6).
_NORM_EPS = 1e-6
_TIME_FREQ_DIM = 256  # sinusoidal time features [sin | cos], 128 frequencies each
_TIME_SCALE = 1000.0


def _rotary_inv_freq(dim: int, device=None) -> torch.Tensor:
    """x-transformers `RotaryEmbedding(dim).inv_freq`: 10000^(-2j/dim), j < dim/2, fp32."""
    return 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device).float() / dim))


class InterleavedRotary(nn.Module):
    """x-transformers 2.15.2 `RotaryEmbedding(dim)`: adjacent dims (2j, 2j+1) share frequency j.

    `inv_freq` is a persistent buffer (stored in the checkpoint). Angles are computed in fp32
    from positions 0..T-1 (the reference's bf16 run forms them in bf16; fp32 is the exact math).
    """

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.register_buffer("inv_freq", _rotary_inv_freq(dim), persistent=True)

    def init_buffers(self) -> None:
        self.inv_freq = _rotary_inv_freq(self.dim, device=self.inv_freq.device)

    def forward(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin tables [seq_len, dim] in fp32, each frequency repeated for its pair."""
        pos = torch.arange(seq_len, device=self.inv_freq.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq.float()[None, :]
        freqs = freqs.repeat_interleave(2, dim=-1)
        return freqs.cos(), freqs.sin()


def apply_interleaved_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x0, x1), (x2, x3), ... of the last dim by the tables; fp32 math, cast back."""
    xf = x.float()
    pairs = xf.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return (xf * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    """Bidirectional multi-head attention (`to_q/to_k/to_v/to_out.0`, biases), RoPE on q and k."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)
        self.to_v = nn.Linear(dim, dim)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])  # index 1 was a Dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (proj(x).view(b, t, self.heads, -1).transpose(1, 2) for proj in (self.to_q, self.to_k, self.to_v))
        q = apply_interleaved_rotary(q, cos, sin)
        k = apply_interleaved_rotary(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out[0](out.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    """Linear → tanh-GELU → Linear, keys `ff.0.0` and `ff.2` (index 1 was a Dropout)."""

    def __init__(self, dim: int, mult: float):
        super().__init__()
        inner = int(dim * mult)
        self.ff = nn.Sequential(
            nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
            nn.Identity(),
            nn.Linear(inner, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    """Pre-norm block: x += Attn(RMSNorm1(x)); x += FF(RMSNorm2(x))."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = RMSNorm(dim, _NORM_EPS)
        self.attn = Attention(dim, heads)
        self.norm2 = RMSNorm(dim, _NORM_EPS)
        self.mlp = FeedForward(dim, mlp_ratio)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class FinalLayer(nn.Module):
    """RMSNorm then Linear (`norm_final`, `linear`)."""

    def __init__(self, dim: int, out_dim: int):
        super().__init__()
        self.norm_final = RMSNorm(dim, _NORM_EPS)
        self.linear = nn.Linear(dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm_final(x))


def _time_freqs(device=None) -> torch.Tensor:
    half = _TIME_FREQ_DIM // 2
    return torch.exp(torch.arange(half, device=device).float() * -(math.log(10000) / (half - 1)))


class TimestepEmbedder(nn.Module):
    """Scalar time → [sin | cos](1000·t·exp(−ln(1e4)·k/127)) (fp32) → Linear, SiLU, Linear."""

    def __init__(self, dim: int):
        super().__init__()
        self.time_mlp = nn.Sequential(nn.Linear(_TIME_FREQ_DIM, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.register_buffer("freqs", _time_freqs(), persistent=False)

    def init_buffers(self) -> None:
        self.freqs = _time_freqs(device=self.freqs.device)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """t [N] (any float dtype; 1000·t is formed in t's dtype as the reference does) → [N, D]."""
        angles = (_TIME_SCALE * t)[:, None] * self.freqs.float()[None, :]
        emb = torch.cat((angles.sin(), angles.cos()), dim=-1).to(t.dtype)
        return self.time_mlp(emb.to(self.time_mlp[0].weight.dtype))


class CondEmbedder(nn.Module):
    """Linear projection of the talker-LM hidden state (`cond_embedder`)."""

    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.cond_embedder = nn.Linear(in_dim, dim)

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return self.cond_embedder(c)


class DiT(nn.Module):
    """CFM velocity network (§5.5): sequence [t_emb + c_emb ; history ; noisy patch] → velocity.

    Keys `t_embedder`, `x_embedder`, `c_embedder`, `rotary_embed`, `blocks.N`, `final_layer`.
    """

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        d = cfg.hidden_size
        if d % cfg.num_heads:
            raise ValueError(f"flowmodel.hidden_size {d} not divisible by num_heads {cfg.num_heads}")
        self.cfg = cfg
        self.t_embedder = TimestepEmbedder(d)
        self.x_embedder = nn.Linear(cfg.in_channels, d)
        self.c_embedder = CondEmbedder(cfg.llm_cond_dim, d)
        self.rotary_embed = InterleavedRotary(d // cfg.num_heads)
        self.blocks = nn.ModuleList(DiTBlock(d, cfg.num_heads, cfg.mlp_ratio) for _ in range(cfg.depth))
        self.final_layer = FinalLayer(d, cfg.in_channels)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """x [N, P, C] noisy patch, t [N], cond [N, 1, Dc], history [N, Hh, C] → velocity [N, P, C]."""
        tokens = self.x_embedder(torch.cat((history, x), dim=1))
        y = self.t_embedder(t).unsqueeze(1) + self.c_embedder(cond)
        h = torch.cat((y, tokens), dim=1)
        cos, sin = self.rotary_embed(h.shape[1])
        for block in self.blocks:
            h = block(h, cos, sin)
        # the final layer is position-wise: only the patch positions are needed
        return self.final_layer(h[:, -x.shape[1]:])

    def forward_with_cfg(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor,
                         history: torch.Tensor) -> torch.Tensor:
        """One pass on 2B rows: [conditional (cond) ; unconditional (cond = 0)] → [2B, P, C].

        t is a scalar tensor (shared) or [B]; rows keep their own history and noisy patch.
        """
        b = x.shape[0]
        t2 = t.expand(b) if t.dim() == 0 else t
        return self.forward(
            torch.cat((x, x)), torch.cat((t2, t2)), torch.cat((cond, torch.zeros_like(cond))),
            torch.cat((history, history)),
        )


class Aggregator(nn.Module):
    """Latent patch [B, P, C] → next talker-LM input embedding [B, 1, H_llm] (§5.7).

    A learned CLS token (`word_embedder.weight[0]`) is prepended to `x_embedder(latents)`; the
    same blocks and rotary as the DiT run bidirectionally; the CLS row goes through `final_layer`.
    """

    def __init__(self, cfg: DiTConfig, llm_hidden: int):
        super().__init__()
        d = cfg.hidden_size
        if d % cfg.num_heads:
            raise ValueError(f"aggregator.hidden_size {d} not divisible by num_heads {cfg.num_heads}")
        self.cfg = cfg
        self.word_embedder = nn.Embedding(1, d)
        self.x_embedder = nn.Linear(cfg.in_channels, d)
        self.rotary_embed = InterleavedRotary(d // cfg.num_heads)
        self.blocks = nn.ModuleList(DiTBlock(d, cfg.num_heads, cfg.mlp_ratio) for _ in range(cfg.depth))
        self.final_layer = FinalLayer(d, llm_hidden)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        x = self.x_embedder(latents)
        cls = self.word_embedder.weight[:1].expand(x.shape[0], 1, -1)
        h = torch.cat((cls, x), dim=1)
        cos, sin = self.rotary_embed(h.shape[1])
        for block in self.blocks:
            h = block(h, cos, sin)
        return self.final_layer(h[:, :1])
