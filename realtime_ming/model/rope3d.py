"""Thinker rotary embedding: partial NeoX RoPE with the 3-D "video_rope" frequency mapping.

Reproduces `BailingMoeV2RotaryEmbedding3D` + `apply_3d_rotary_pos_emb(rope_type="video_rope")`
(docs/model.md §1.3, §1.5 b): position ids are [3, B, T] rows (t, h, w); of the rotary_dim/2
frequencies, f < 24 take the h row (even f) or the w row (odd f), f >= 24 the t row. With all
three rows equal (text) this is ordinary partial RoPE on the first rotary_dim head dims.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import rope_inv_freq

__all__ = ["ThinkerRotary", "video_rope_rows", "text_position_ids"]

# mrope_section [8, 12, 12] hard-coded by the reference attention: 8 t-frequencies, 24 h/w ones.
_MROPE_SECTION = (8, 12, 12)


def video_rope_rows(num_freqs: int, video_rope: bool = True) -> torch.Tensor:
    """Position row (0 t, 1 h, 2 w) feeding each of the `num_freqs` rotary frequencies."""
    rows = torch.zeros(num_freqs, dtype=torch.int64)
    if not video_rope:
        return rows
    t_freqs, h_freqs, w_freqs = _MROPE_SECTION
    spatial = h_freqs + w_freqs
    if t_freqs + spatial != num_freqs:
        raise ValueError(f"video_rope needs {t_freqs + spatial} rotary frequencies, got {num_freqs}")
    f = torch.arange(spatial)
    rows[:spatial] = torch.where(f % 2 == 0, 1, 2)
    return rows


class ThinkerRotary(nn.Module):
    """cos/sin tables [B, 1, T, rotary_dim] for 3-row integer positions (fp32 math, cast to dtype)."""

    def __init__(self, rotary_dim: int, theta: float, video_rope: bool):
        super().__init__()
        self.rotary_dim, self.theta, self.video_rope = rotary_dim, theta, video_rope
        self.register_buffer("inv_freq", rope_inv_freq(rotary_dim, theta), persistent=False)
        self.register_buffer("rows", video_rope_rows(rotary_dim // 2, video_rope), persistent=False)

    def init_buffers(self) -> None:
        device = self.inv_freq.device
        self.inv_freq = rope_inv_freq(self.rotary_dim, self.theta, device=device)
        self.rows = video_rope_rows(self.rotary_dim // 2, self.video_rope).to(device)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids [3, B, T] int64 -> (cos, sin), each [B, 1, T, rotary_dim] in `dtype`."""
        _, b, t = position_ids.shape
        nf = self.inv_freq.shape[0]
        # pick, per frequency, the position row it rotates with (selecting before the product
        # equals the reference, which rotates all three rows and then selects)
        pos = position_ids.clamp(min=0)[..., None].expand(3, b, t, nf)
        pos = pos.gather(0, self.rows.view(1, 1, 1, nf).expand(1, b, t, nf))[0]  # [B, T, F]
        freqs = pos.float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def text_position_ids(cache_positions: torch.Tensor, rope_deltas: torch.Tensor) -> torch.Tensor:
    """3-row positions for text tokens after a prefill: cache position + rope delta in every row.

    cache_positions [B, T] int64 (-1 = padding, kept -1); rope_deltas [B] or [B, 1] int64.
    Used for decode (docs/model.md §1.5 a) and for text-only continuation chunks.
    """
    pos = cache_positions + rope_deltas.reshape(-1, 1)
    pos = torch.where(cache_positions < 0, cache_positions, pos)
    return pos.unsqueeze(0).expand(3, *pos.shape)
