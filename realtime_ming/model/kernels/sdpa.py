"""Scaled dot-product attention for inputs whose length changes from call to call (PyTorch's fused
backends, chosen so that no per-shape plan is built while serving)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["attention_any_length"]

_ANY_LENGTH_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_any_length(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                         enable_gqa: bool = False) -> torch.Tensor:
    """`F.scaled_dot_product_attention` for inputs whose length changes from call to call (audio and
    vision encoders, thinker prefill): cuDNN's backend is left out, since it builds an execution plan
    for every new shape, 50-130 ms each (measured on an H200: the audio encoder's first call at each
    clip length), which a server would pay on nearly every turn. Flash and memory-efficient attention
    serve any length at once. Fixed-shape graphed paths (talker LM decode, DiT, VAE chunk) keep cuDNN,
    whose plans are built once at capture and are faster there.

    Grouped K/V with a mask (thinker prefill) has no fused kernel in PyTorch: it fell back to the math
    backend, in fp32 (on an H200 ~9 ms of a 41 ms 128-token prefill). K/V expanded to every query
    head (head h reads kv head h // group, as `enable_gqa` does) take the memory-efficient kernel."""
    if enable_gqa and attn_mask is not None and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
        enable_gqa = False
    with sdpa_kernel(_ANY_LENGTH_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=enable_gqa)
