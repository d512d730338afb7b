"""Vision encoder stage: [MING] `Qwen3MoeVisionTransformer` + `linear_proj` (docs/model.md §3.3–3.4).

pixel_values [N, 3·2·16·16] (merge-block row order, see `image_processing`) with per-image grids
(t, h, w) → ViT [N/4, out_hidden] → projector [N/4, hidden], unit-norm. Attention never crosses an
image or temporal frame, so a batch equals the concatenation of per-image results."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .kernels.sdpa import attention_any_length
from .config import VisionConfig
from .kernels.rotary import apply_rotary

__all__ = [
    "Grid",
    "grid_list",
    "num_vision_tokens",
    "VisionTransformer",
    "VisionProjector",
]

_LN_EPS = 1e-6
_ROPE_THETA = 10000.0

Grid = tuple[int, int, int]  # (t, h, w) in patches: temporal groups, rows, columns


def grid_list(grid_thw: torch.Tensor | Sequence[Sequence[int]]) -> list[Grid]:
    """Per-image (t, h, w) grids as Python ints (host) from a [N, 3] tensor or nested sequence."""
    rows = grid_thw.tolist() if isinstance(grid_thw, torch.Tensor) else grid_thw
    return [(int(t), int(h), int(w)) for t, h, w in rows]


def num_vision_tokens(grid: Grid, merge_size: int = 2) -> int:
    """Tokens (placeholders) one image/video yields: t·h·w / merge²."""
    t, h, w = grid
    return t * h * w // (merge_size * merge_size)


class _PatchEmbed(nn.Module):
    """`patch_embed.proj`: the Conv3d (kernel = stride = patch) computed as a Linear over 1536 values.

    The Conv3d weight [hidden, C, T, P, P] is kept in the checkpoint's shape; its row-major view
    [hidden, C·T·P·P] matches the (c, t, ph, pw) column order of the pixel rows (§3.3 step 1).
    """

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=kernel, stride=kernel, bias=True)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight
        return F.linear(pixel_values.to(weight.dtype), weight.reshape(weight.shape[0], -1), self.proj.bias)


class _VisionAttention(nn.Module):
    """`attn`: fused `qkv` laid out [3, heads, head_dim], 2-D RoPE on q/k, `proj`; per-segment attention."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                segments: list[tuple[int, int]]) -> torch.Tensor:
        n, dim = x.shape
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, -1).unbind(1)  # each [n, heads, head_dim]
        q = apply_rotary(q.float(), cos, sin).to(v.dtype)
        k = apply_rotary(k.float(), cos, sin).to(v.dtype)
        out = torch.empty_like(q)
        start = 0
        # segments = runs of `count` consecutive frames of `length` patches each: one batched
        # SDPA call per run, no mask, attention confined to each frame (the reference cu_seqlens)
        for length, count in segments:
            stop = start + length * count
            qs, ks, vs = (t[start:stop].view(count, length, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
            out[start:stop] = attention_any_length(qs, ks, vs).transpose(1, 2).reshape(stop - start,
                                                                                                  self.num_heads, -1)
            start = stop
        return self.proj(out.reshape(n, dim))


class _VisionMLP(nn.Module):
    """`mlp`: linear_fc1 → tanh-GELU (`gelu_pytorch_tanh`) → linear_fc2."""

    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(dim, inner)
        self.linear_fc2 = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class _VisionBlock(nn.Module):
    """Pre-LN block: x += attn(norm1(x)); x += mlp(norm2(x)); LayerNorm eps 1e-6."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=_LN_EPS)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=_LN_EPS)
        self.attn = _VisionAttention(cfg.hidden_size, cfg.num_heads)
        self.mlp = _VisionMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                segments: list[tuple[int, int]]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class _PatchMerger(nn.Module):
    """`merger` / `deepstack_merger_list.k`: group 2×2 patches → linear_fc1 → exact GELU → linear_fc2.

    `postshuffle_norm=False` (merger): LayerNorm(hidden) per patch before grouping;
    True (deepstack): LayerNorm(4·hidden) after grouping (§3.3 steps 5–6).
    """

    def __init__(self, cfg: VisionConfig, postshuffle_norm: bool):
        super().__init__()
        self.merged = cfg.hidden_size * cfg.spatial_merge_size ** 2
        self.postshuffle_norm = postshuffle_norm
        self.norm = nn.LayerNorm(self.merged if postshuffle_norm else cfg.hidden_size, eps=_LN_EPS)
        self.linear_fc1 = nn.Linear(self.merged, self.merged)
        self.linear_fc2 = nn.Linear(self.merged, cfg.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.postshuffle_norm:
            x = self.norm(x.reshape(-1, self.merged))
        else:
            x = self.norm(x).reshape(-1, self.merged)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionTransformer(nn.Module):
    """Ming's `Qwen3MoeVisionTransformer` with `use_deepstack=False` (§3.3), prefix `vision.`.

    `deepstack_merger_list` parameters exist so the checkpoint loads strictly; the reference
    computes those features and discards them, so they are skipped unless asked for.
    `inv_freq` (2-D RoPE, head_dim/4 frequencies, fp32) is a non-persistent buffer.
    """

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        if cfg.hidden_size % cfg.num_heads or (cfg.hidden_size // cfg.num_heads) % 4:
            raise ValueError("vision head_dim must be a multiple of 4 (2-D rotate-half RoPE)")
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.merge = cfg.spatial_merge_size
        self.grid_side = int(round(cfg.num_position_embeddings ** 0.5))
        self.deepstack_indexes = list(cfg.deepstack_visual_indexes)
        self.patch_embed = _PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.blocks = nn.ModuleList(_VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = _PatchMerger(cfg, postshuffle_norm=False)
        self.deepstack_merger_list = nn.ModuleList(
            _PatchMerger(cfg, postshuffle_norm=True) for _ in self.deepstack_indexes
        )
        self.register_buffer("inv_freq", self._inv_freq(None), persistent=False)

    def _inv_freq(self, device) -> torch.Tensor:
        # VisionRotaryEmbedding(head_dim/2): theta^(-2j/(head_dim/2)), j < head_dim/4, fp32
        dim = self.head_dim // 2
        return 1.0 / (_ROPE_THETA ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))

    def init_buffers(self) -> None:
        self.inv_freq = self._inv_freq(self.inv_freq.device)

    def _merge_order(self, x: torch.Tensor, t: int, h: int, w: int) -> torch.Tensor:
        """Row-major [h·w, ...] per frame → repeated over t, in (t, h_block, w_block, h_in, w_in) order."""
        m = self.merge
        x = x.repeat(t, *([1] * (x.dim() - 1)))
        x = x.view(t, h // m, m, w // m, m, *x.shape[1:]).transpose(2, 3)
        return x.flatten(0, 4)

    def position_embeddings(self, grids: list[Grid]) -> torch.Tensor:
        """Bilinear interpolation of the learned side×side table to each grid (§3.3 step 2): [N, hidden]."""
        weight = self.pos_embed.weight
        side, device = self.grid_side, weight.device
        parts = []
        for t, h, w in grids:
            rows = torch.linspace(0, side - 1, h, device=device)  # corner-aligned sample coordinates, fp32
            cols = torch.linspace(0, side - 1, w, device=device)
            r0, c0 = rows.int(), cols.int()
            r1, c1 = (r0 + 1).clamp(max=side - 1), (c0 + 1).clamp(max=side - 1)
            dr, dc = (rows - r0)[:, None], (cols - c0)[None, :]
            taps = (
                (r0[:, None] * side + c0[None, :], (1 - dr) * (1 - dc)),
                (r0[:, None] * side + c1[None, :], (1 - dr) * dc),
                (r1[:, None] * side + c0[None, :], dr * (1 - dc)),
                (r1[:, None] * side + c1[None, :], dr * dc),
            )
            emb = None
            for index, tap_weight in taps:
                term = F.embedding(index.flatten().long(), weight) * tap_weight.flatten().to(weight.dtype)[:, None]
                emb = term if emb is None else emb + term
            parts.append(self._merge_order(emb, t, h, w))
        return torch.cat(parts)

    def rotary_tables(self, grids: list[Grid]) -> tuple[torch.Tensor, torch.Tensor]:
        """2-D RoPE cos/sin [N, 1, head_dim] fp32: [row freqs | column freqs] duplicated (§3.3 step 3)."""
        inv_freq = self.inv_freq.float()
        parts = []
        for t, h, w in grids:
            rows = torch.arange(h, device=inv_freq.device, dtype=torch.float32)[:, None].expand(h, w)
            cols = torch.arange(w, device=inv_freq.device, dtype=torch.float32)[None, :].expand(h, w)
            pos = torch.stack((rows, cols), dim=-1).reshape(h * w, 2)
            parts.append(self._merge_order(pos, t, h, w))
        pos = torch.cat(parts)
        freqs = (pos[:, :, None] * inv_freq[None, None, :]).flatten(1)  # [N, head_dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return emb.cos(), emb.sin()

    @staticmethod
    def _segments(grids: list[Grid]) -> list[tuple[int, int]]:
        """Attention segments as runs (frame length in patches, number of consecutive frames)."""
        runs: list[tuple[int, int]] = []
        for t, h, w in grids:
            if runs and runs[-1][0] == h * w:
                runs[-1] = (h * w, runs[-1][1] + t)
            else:
                runs.append((h * w, t))
        return runs

    def forward(self, pixel_values: torch.Tensor, grid_thw, return_deepstack: bool = False):
        """pixel_values [N, C·T·P·P], grid_thw [n_images, 3] (tensor or list) → [N/merge², out_hidden].

        With `return_deepstack=True` returns (output, [deepstack features after the blocks in
        `deepstack_visual_indexes`, each [N/merge², out_hidden]]) — debugging only. Host-side
        work per call (grid shapes); intended for prefill, not per-step decode.
        """
        grids = grid_list(grid_thw)
        if sum(t * h * w for t, h, w in grids) != pixel_values.shape[0]:
            raise ValueError(f"grid_thw {grids} does not match {pixel_values.shape[0]} patch rows")
        if any(h % self.merge or w % self.merge for _, h, w in grids):
            raise ValueError(f"grid sides must be multiples of spatial_merge_size {self.merge}: {grids}")
        x = self.patch_embed(pixel_values)
        x = x + self.position_embeddings(grids)
        cos, sin = self.rotary_tables(grids)
        segments = self._segments(grids)
        deepstack = []
        for layer, block in enumerate(self.blocks):
            x = block(x, cos, sin, segments)
            if return_deepstack and layer in self.deepstack_indexes:
                deepstack.append(self.deepstack_merger_list[self.deepstack_indexes.index(layer)](x))
        out = self.merger(x)
        return (out, deepstack) if return_deepstack else out


class VisionProjector(nn.Module):
    """`linear_proj` (§3.4): Linear → GELU → Linear (submodules `0`, `2`), then L2 normalisation."""

    def __init__(self, cfg: VisionConfig, hidden_size: int):
        super().__init__()
        self.add_module("0", nn.Linear(cfg.out_hidden_size, hidden_size))
        self.add_module("2", nn.Linear(hidden_size, hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """ViT output [N, out_hidden] → unit-norm image embeddings [N, hidden]."""
        y = self._modules["2"](F.gelu(self._modules["0"](x)))
        return F.normalize(y, dim=-1)
