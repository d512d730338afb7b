"""Talker transformers: the CFM velocity network `DiT` (`cfm.model`) and the `Aggregator`.

Reproduces docs/model.md §5.5 and §5.7 ([MING] `talker_module/{dit,modules,aggregator}.py`:
`DiT`, `DiTBlock`, `Attention`, `FeedForward`, `FinalLayer`, `TimestepEmbedder`, `CondEmbedder`,
`Aggregator`) with x-transformers 2.15.2 `RotaryEmbedding` (interleaved / GPT-J pairing).
Both networks share the block stack; every input is batched (each row its own condition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import DiTConfig
from .kernels.dit_attention import rotary_attention
from .kernels.rotary import apply_interleaved_rotary
from .kernels.selection import REFERENCE, Kernels
from .layers import RMSNorm, concat_params, prenorm_stack

__all__ = [
    "InterleavedRotary",
    "apply_interleaved_rotary",
    "DiTBlock",
    "FinalLayer",
    "TimestepEmbedder",
    "CondEmbedder",
    "DiT",
    "CFGContext",
    "Aggregator",
    "run_blocks",
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
        """cos, sin tables [seq_len, dim] in fp32, each frequency repeated for its pair.

        Cached per length (the talker only ever uses two): computed by the first, eager call, so a
        CUDA-graph capture that follows replays no table math.
        """
        key = (seq_len, self.inv_freq.data_ptr(), self.inv_freq._version)  # a reloaded buffer recomputes
        tables = self.__dict__.setdefault("_tables", {})
        if key not in tables:
            pos = torch.arange(seq_len, device=self.inv_freq.device, dtype=torch.float32)
            freqs = pos[:, None] * self.inv_freq.float()[None, :]
            freqs = freqs.repeat_interleave(2, dim=-1)
            tables[key] = (freqs.cos(), freqs.sin())
        return tables[key]


class Attention(nn.Module):
    """Bidirectional multi-head attention (`to_q/to_k/to_v/to_out.0`, biases), RoPE on q and k."""

    def __init__(self, dim: int, heads: int, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.heads, self.kernels = heads, kernels
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)
        self.to_v = nn.Linear(dim, dim)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])  # index 1 was a Dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, queries: int | None = None) -> torch.Tensor:
        """x [B, T, D] -> [B, Q, D]: the last Q = `queries` positions (default all T) attending to all T."""
        projs = (self.to_q, self.to_k, self.to_v)
        qkv = F.linear(x, concat_params(self, "_qkv_w", tuple(p.weight for p in projs)),
                       concat_params(self, "_qkv_b", tuple(p.bias for p in projs)))
        return self.to_out[0](rotary_attention(qkv, self.heads, cos, sin, kernels=self.kernels, queries=queries))


class FeedForward(nn.Module):
    """Linear → tanh-GELU → Linear, keys `ff.0.0` and `ff.2` (index 1 was a Dropout)."""

    def __init__(self, dim: int, mult: float, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.kernels = kernels
        inner = int(dim * mult)
        self.ff = nn.Sequential(
            nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
            nn.Identity(),
            nn.Linear(inner, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lin = self.ff[0][0]
        if self.kernels.on_device(x.device):  # the tanh-GELU as the GEMM's epilogue (cuBLASLt): one kernel, not two
            rows = x.reshape(-1, x.shape[-1])
            h = torch._addmm_activation(lin.bias, rows, lin.weight.t(), use_gelu=True).view(*x.shape[:-1], -1)
            return self.ff[2](h)
        return self.ff(x)


class DiTBlock(nn.Module):
    """Pre-norm block: x += Attn(RMSNorm1(x)); x += FF(RMSNorm2(x)) (run by `run_blocks`)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.norm1 = RMSNorm(dim, _NORM_EPS, kernels=kernels)
        self.attn = Attention(dim, heads, kernels=kernels)
        self.norm2 = RMSNorm(dim, _NORM_EPS, kernels=kernels)
        self.mlp = FeedForward(dim, mlp_ratio, kernels=kernels)

    def forward(self, x: torch.Tensor, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                keep: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x the residual stream, h = norm1(x) -> (x after attention, the FF output still to add), for the last
        `keep` positions only when given (everything after the attention is position-wise)."""
        delta = self.attn(h, cos, sin, queries=keep)
        h, x = self.norm2.add(x if keep is None else x[:, -keep:], delta)
        return x, self.mlp(h)


def run_blocks(blocks: nn.ModuleList, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               final_norm: RMSNorm, keep: int | None = None) -> torch.Tensor:
    """final_norm(block stack(x)), every residual add fused into the norm that follows it; with `keep`, only the
    last `keep` positions of the result (the last block computes no other: its attention queries only those)."""
    last = len(blocks) - 1
    return prenorm_stack(blocks, x, lambda block: block.norm1, final_norm,
                         lambda i, block, x, h: block(x, h, cos, sin, keep if i == last else None))


class FinalLayer(nn.Module):
    """RMSNorm then Linear (`norm_final`, `linear`)."""

    def __init__(self, dim: int, out_dim: int, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.norm_final = RMSNorm(dim, _NORM_EPS, kernels=kernels)
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

    def __init__(self, cfg: DiTConfig, *, kernels: Kernels = REFERENCE):
        super().__init__()
        d = cfg.hidden_size
        if d % cfg.num_heads:
            raise ValueError(f"flowmodel.hidden_size {d} not divisible by num_heads {cfg.num_heads}")
        self.cfg, self.kernels = cfg, kernels
        self.t_embedder = TimestepEmbedder(d)
        self.x_embedder = nn.Linear(cfg.in_channels, d)
        self.c_embedder = CondEmbedder(cfg.llm_cond_dim, d)
        self.rotary_embed = InterleavedRotary(d // cfg.num_heads)
        self.blocks = nn.ModuleList(DiTBlock(d, cfg.num_heads, cfg.mlp_ratio, kernels=kernels)
                                    for _ in range(cfg.depth))
        self.final_layer = FinalLayer(d, cfg.in_channels, kernels=kernels)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """x [N, P, C] noisy patch, t [N], cond [N, 1, Dc], history [N, Hh, C] → velocity [N, P, C]."""
        tokens = self.x_embedder(torch.cat((history, x), dim=1))
        y = self.t_embedder(t).unsqueeze(1) + self.c_embedder(cond)
        return self._velocity(torch.cat((y, tokens), dim=1), x.shape[1])

    def _velocity(self, h: torch.Tensor, patch: int) -> torch.Tensor:
        cos, sin = self.rotary_embed(h.shape[1])
        # only the patch positions' velocity is needed: the last block computes no other
        return self.final_layer.linear(run_blocks(self.blocks, h, cos, sin, self.final_layer.norm_final, keep=patch))

    def cfg_context(self, cond: torch.Tensor, history: torch.Tensor, t: torch.Tensor) -> "CFGContext":
        """What every step of one CFG sampling run shares: cond [B, 1, Dc], history [B, Hh, C], the step
        times t [S]. Rows are [conditional ; unconditional (cond = 0)]; the embeddings are those
        `forward` computes (x_embedder is position-wise, so the history's part is the same every step)."""
        t_emb = self.t_embedder(t)[:, None]  # [S, 1, D]
        c_emb = self.c_embedder(torch.cat((cond, torch.zeros_like(cond))))  # [2B, 1, D]
        his = self.x_embedder(history)
        return CFGContext(t_emb, c_emb, torch.cat((his, his)))

    def forward_with_cfg(self, x: torch.Tensor, step: int, ctx: "CFGContext") -> torch.Tensor:
        """Velocity of the noisy patch x [B, P, C] at step `step` of `ctx`, for the 2B rows
        [conditional ; unconditional] in one pass → [2B, P, C]."""
        tokens = self.x_embedder(x)
        y = ctx.t_emb[step] + ctx.c_emb  # [2B, 1, D]
        return self._velocity(torch.cat((y, ctx.history, torch.cat((tokens, tokens))), dim=1), x.shape[1])


@dataclass(frozen=True)
class CFGContext:
    """Per-call constants of a CFG sampling run (`DiT.cfg_context`)."""

    t_emb: torch.Tensor  # [S, 1, D] time embedding of each step
    c_emb: torch.Tensor  # [2B, 1, D] condition embedding, conditional then unconditional rows
    history: torch.Tensor  # [2B, Hh, D] embedded history, both halves


class Aggregator(nn.Module):
    """Latent patch [B, P, C] → next talker-LM input embedding [B, 1, H_llm] (§5.7).

    A learned CLS token (`word_embedder.weight[0]`) is prepended to `x_embedder(latents)`; the
    same blocks and rotary as the DiT run bidirectionally; the CLS row goes through `final_layer`.
    """

    def __init__(self, cfg: DiTConfig, llm_hidden: int, *, kernels: Kernels = REFERENCE):
        super().__init__()
        d = cfg.hidden_size
        if d % cfg.num_heads:
            raise ValueError(f"aggregator.hidden_size {d} not divisible by num_heads {cfg.num_heads}")
        self.cfg = cfg
        self.word_embedder = nn.Embedding(1, d)
        self.x_embedder = nn.Linear(cfg.in_channels, d)
        self.rotary_embed = InterleavedRotary(d // cfg.num_heads)
        self.blocks = nn.ModuleList(DiTBlock(d, cfg.num_heads, cfg.mlp_ratio, kernels=kernels)
                                    for _ in range(cfg.depth))
        self.final_layer = FinalLayer(d, llm_hidden, kernels=kernels)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        x = self.x_embedder(latents)
        cls = self.word_embedder.weight[:1].expand(x.shape[0], 1, -1)
        h = torch.cat((cls, x), dim=1)
        cos, sin = self.rotary_embed(h.shape[1])
        h = run_blocks(self.blocks, h, cos, sin, self.final_layer.norm_final)
        return self.final_layer.linear(h[:, :1])
