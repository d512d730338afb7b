"""Qwen2 decoder stack: the talker LM (`talker/llm`, docs/model.md §5.2–5.3) and the AudioVAE
backbones (causal sliding-window, §6.2–6.4).

HF Qwen2 math: q/k/v projections with bias, o_proj without, NeoX RoPE over the whole head dim
(fp32 tables cast to the activation dtype), GQA, SwiGLU MLP, RMSNorm. Caching is explicit:
`KVCache` is a static ring buffer per layer addressed by absolute positions, so batched rows
may sit at different positions, shapes never change between steps (graph-capturable), and a
sliding window is just a mask — streaming in chunks equals one full-sequence pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import Qwen2Config
from .kernels.rotary import RotaryStyle, head_rotary
from .kernels.selection import REFERENCE, Kernels
from .kernels.slot_attention import decode_attention
from .kernels.swiglu import silu_mul
from .layers import RMSNorm, concat_params, prenorm_stack, rope_inv_freq

__all__ = ["KVCache", "Qwen2Model", "Qwen2Rotary", "causal_window_mask"]


@dataclass
class KVCache:
    """Static per-layer K/V ring buffers for `batch` rows and `capacity` slots.

    k, v: [layers, batch, kv_heads, capacity + 1, head_dim]; slot_pos: [batch, capacity + 1]
    int64 — the absolute position stored in each slot, -1 = empty. A token at position p goes to
    slot p % capacity; capacity must exceed (window - 1) + the longest chunk fed at once when a
    window is used, or the longest sequence otherwise. Padding tokens (position -1) write into
    the extra last slot, whose position stays -1, so their K/V are never visible.
    """

    k: torch.Tensor
    v: torch.Tensor
    slot_pos: torch.Tensor

    @classmethod
    def allocate(cls, cfg: Qwen2Config, batch: int, capacity: int, device, dtype) -> "KVCache":
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, capacity + 1, cfg.resolved_head_dim)
        return cls(
            torch.zeros(shape, device=device, dtype=dtype),
            torch.zeros(shape, device=device, dtype=dtype),
            torch.full((batch, capacity + 1), -1, device=device, dtype=torch.int64),
        )

    @property
    def capacity(self) -> int:
        return self.slot_pos.shape[1] - 1

    def rows(self, start: int, stop: int) -> "KVCache":
        """A view of rows [start, stop) (writes go to this cache)."""
        return KVCache(self.k[:, start:stop], self.v[:, start:stop], self.slot_pos[start:stop])

    def copy_row(self, src: int, dst: int) -> None:
        """Move row `src`'s contents into row `dst` (stream compaction)."""
        self.k[:, dst].copy_(self.k[:, src])
        self.v[:, dst].copy_(self.v[:, src])
        self.slot_pos[dst].copy_(self.slot_pos[src])

    def reset(self, rows: torch.Tensor | None = None) -> None:
        """Forget rows (all when None); K/V bytes stay, the -1 marks make them invisible."""
        if rows is None:
            self.slot_pos.fill_(-1)
        else:
            self.slot_pos[rows] = -1

    def write_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Record `positions` [B, T] (-1 = padding, not written) and return their slots [B, T]."""
        keep = positions >= 0
        slots = torch.where(keep, positions.clamp(min=0) % self.capacity, self.capacity)
        self.slot_pos.scatter_(1, slots, torch.where(keep, positions, -1))
        return slots


def causal_window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Boolean [B, 1, T, S]: key visible iff 0 <= k_pos <= q_pos and (no window or k_pos > q_pos - window)."""
    q = q_pos[:, None, :, None]
    k = k_pos[:, None, None, :]
    mask = (k >= 0) & (k <= q)
    if window is not None:
        mask = mask & (k > q - window)
    # padding queries (q < 0) see every key: their output is discarded, but must stay finite
    return mask | (q < 0)


class Qwen2Rotary(nn.Module):
    """Rotary tables for integer positions (HF default rope, theta from the config)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta), persistent=False)

    def init_buffers(self) -> None:
        self.inv_freq = rope_inv_freq(self.head_dim, self.theta, device=self.inv_freq.device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.clamp(min=0).float()[..., None] * self.inv_freq.float()  # [B, T, d/2] fp32
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]  # [B, 1, T, d]


class Qwen2Attention(nn.Module):
    """q/k/v projections (with bias; run as one fused GEMM), NeoX RoPE, GQA attention, o_proj."""

    def __init__(self, cfg: Qwen2Config, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.kernels = kernels
        self.num_heads = cfg.num_attention_heads
        self.num_kv = cfg.num_key_value_heads
        self.head_dim = cfg.resolved_head_dim
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(h, self.num_kv * self.head_dim, bias=True)
        self.v_proj = nn.Linear(h, self.num_kv * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)

    def forward(self, x, cos, sin, mask, cache_kv=None, slots=None, lengths=None):
        """`lengths` [B] (one new token per row, no window): row b attends cache slots [0, lengths[b]) with
        the fused decode kernel instead of `mask`."""
        b, t, _ = x.shape
        projs = (self.q_proj, self.k_proj, self.v_proj)
        qkv = F.linear(x, concat_params(self, "_qkv_w", tuple(p.weight for p in projs)),
                       concat_params(self, "_qkv_b", tuple(p.bias for p in projs)))
        style = RotaryStyle.NEOX_ROUND_EACH
        if cache_kv is not None:
            ck, cv = cache_kv  # [B, kv, S, d] views into the cache: k/v written at their slots
            q, _, _ = head_rotary(qkv, self.num_heads, self.num_kv, self.head_dim, cos, sin, style,
                                  k_out=ck, v_out=cv, index=slots, kernels=self.kernels)
            k, v = ck, cv
        else:
            q, k, v = head_rotary(qkv, self.num_heads, self.num_kv, self.head_dim, cos, sin, style,
                                  kernels=self.kernels)
        if lengths is not None:
            rows = torch.arange(b, device=x.device)
            out = decode_attention(q, k, v, rows, lengths, kernels=self.kernels)
            return self.o_proj(out.reshape(b, t, -1))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.num_kv != self.num_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class Qwen2MLP(nn.Module):
    """SwiGLU; gate and up run as one fused GEMM."""

    def __init__(self, cfg: Qwen2Config, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.kernels = kernels
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        gate_up = F.linear(x, concat_params(self, "_gate_up", (self.gate_proj.weight, self.up_proj.weight)))
        return self.down_proj(silu_mul(gate_up, kernels=self.kernels))


class Qwen2Layer(nn.Module):
    """Pre-norm block x += attn(norm1(x)); x += mlp(norm2(x)), the adds fused into the norms after them:
    `forward` takes the residual x and h = input_layernorm(x), and returns (x after attention, the
    MLP output) for the caller to add with the next norm (`Qwen2Model.forward`)."""

    def __init__(self, cfg: Qwen2Config, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.self_attn = Qwen2Attention(cfg, kernels=kernels)
        self.mlp = Qwen2MLP(cfg, kernels=kernels)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels=kernels)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels=kernels)

    def forward(self, x, h, cos, sin, mask, cache_kv=None, slots=None, lengths=None):
        h, x = self.post_attention_layernorm.add(x, self.self_attn(h, cos, sin, mask, cache_kv, slots, lengths))
        return x, self.mlp(h)


class Qwen2Model(nn.Module):
    """`Qwen2Model` (keys `embed_tokens`, `layers.N.*`, `norm`); returns final-normed hidden states.

    `run_layers` (default: all) is how many of the held layers the forward runs: HF's forward runs
    `self.layers[: config.num_hidden_layers]`, which is fewer than the layers built when the config
    object is changed after construction (the AudioVAE encoder, vae.py). The other layers keep their
    checkpoint tensors (strict loading) but never run.
    """

    def __init__(self, cfg: Qwen2Config, run_layers: int | None = None, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.cfg, self.kernels = cfg, kernels
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen2Layer(cfg, kernels=kernels) for _ in range(cfg.num_hidden_layers))
        if run_layers is None:
            run_layers = cfg.num_hidden_layers
        if not 0 < run_layers <= cfg.num_hidden_layers:
            raise ValueError(f"run_layers must be in 1..{cfg.num_hidden_layers}, got {run_layers}")
        self.run_layers = run_layers
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels=kernels)
        self.rotary = Qwen2Rotary(cfg.resolved_head_dim, cfg.rope_theta)

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor,
                cache: KVCache | None = None) -> torch.Tensor:
        """inputs_embeds [B, T, H]; positions [B, T] int64 (absolute; -1 = padding row/slot).

        Without a cache the T tokens attend causally among themselves; with one, they are written
        into the cache and attend to everything it holds at earlier positions.
        """
        cos, sin = self.rotary(positions, inputs_embeds.dtype)
        slots = None
        k_pos = positions
        if cache is not None:
            slots = cache.write_positions(positions)
            k_pos = cache.slot_pos
        masks: dict[int | None, torch.Tensor] = {}
        lengths = None
        if cache is not None and positions.shape[1] == 1 and self.kernels.applies(inputs_embeds):
            # decode: a window-less layer's row sees cache slots 0..position (no wrap: without a window the
            # capacity exceeds the longest sequence); padding rows (-1) read one slot, their output is dropped
            lengths = (positions[:, 0] + 1).clamp(1, cache.capacity)

        def step(i, layer, x, h):
            window = self.cfg.layer_window(i)
            kv = (cache.k[i], cache.v[i]) if cache is not None else None
            if window is None and lengths is not None:
                return layer(x, h, cos, sin, None, kv, slots, lengths)
            if window not in masks:
                masks[window] = causal_window_mask(positions, k_pos, window)
            return layer(x, h, cos, sin, masks[window], kv, slots)

        return prenorm_stack(self.layers[: self.run_layers], inputs_embeds, lambda layer: layer.input_layernorm, self.norm, step)
