"""Rotary embeddings: the reference rotations and one Triton kernel that splits a fused QKV projection
into heads, optionally RMS-normalises q and k per head, rotates them and writes K/V into a slot cache.

A reference rotary embedding is eight to twelve kernels, the per-head layout and cache write more;
here one program per token does it all (in a decode step, `step_plan.STEP_PLAN.rotary_heads` heads a program:
more programs, each shorter, the same bits). The kernel rounds where the reference rounds (after the
norm, after each rotary product for `RotaryStyle.NEOX_ROUND_EACH`, once for `INTERLEAVED_FP32`).
The token count is `do_not_specialize` (no recompile when a length is 1 or a multiple of 16).
"""

from __future__ import annotations

import torch

from . import pdl
from .norm import rms_norm_reference
from .selection import Kernels
from .step_plan import step_plan
from .triton_import import tl, triton

__all__ = ["RotaryStyle", "apply_interleaved_rotary", "apply_rotary", "head_rotary", "head_rotary_reference",
           "rotate_half"]

def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """NeoX pairing: dim i pairs with dim i + d/2."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the last dim of `x` (cos/sin broadcastable, same last dim), in x's dtype."""
    return x * cos + rotate_half(x) * sin


def apply_interleaved_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x0, x1), (x2, x3), ... of the last dim by fp32 tables; fp32 math, cast back (GPT-J style)."""
    xf = x.float()
    pairs = xf.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return (xf * cos + rotated * sin).to(x.dtype)


class RotaryStyle:
    """How a model rotates: NeoX rotate-half (Qwen2, thinker) or interleaved pairs (DiT, GPT-J);
    rounded to the activation dtype after every product (ROUND_EACH, HF style) or computed in fp32
    and rounded once (FP32)."""

    NEOX_ROUND_EACH = (0, True)
    INTERLEAVED_FP32 = (1, False)


if triton is not None:
    from .pdl import begin

    @triton.jit(do_not_specialize=['T'])
    def _head_rotary_kernel(qkv_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, q_ptr, k_ptr, v_ptr, rows_ptr, idx_ptr,
                            T, H, KV, eps,
                            stride_qkv, stride_cb, stride_ct,
                            sq_b, sq_h, sq_t, sk_r, sk_h, sk_s,
                            HD: tl.constexpr, RD: tl.constexpr, BLOCK: tl.constexpr, HEADS: tl.constexpr,
                            INTERLEAVED: tl.constexpr, ROUND_EACH: tl.constexpr, QK_NORM: tl.constexpr,
                            HAS_ROWS: tl.constexpr, HAS_IDX: tl.constexpr, PDL: tl.constexpr):
        """One token's HEADS heads from head HEADS * program_id(1) on: norm (optional) and rotate the first RD dims
        of query and key heads, copy the value heads of its key heads. Head j < H is a query head, H <= j < H + KV
        a key head (the rows of the [HEADS, BLOCK] tile). PDL (pdl.py): waits first."""
        begin(PDL)
        tok = tl.program_id(0).to(tl.int64)
        b = tok // T
        t = tok % T
        ty = q_ptr.dtype.element_ty
        j = tl.program_id(1) * HEADS + tl.arange(0, HEADS)[:, None]
        d = tl.arange(0, BLOCK)[None, :]
        is_q = j < H
        live = (j < H + KV) & (d < HD)
        src = qkv_ptr + tok * stride_qkv + j * HD  # q heads, then k heads, in the fused row
        x = tl.load(src + d, mask=live, other=0.0).to(tl.float32)
        if INTERLEAVED:
            partner = d ^ 1
            sign = tl.where(d % 2 == 0, -1.0, 1.0)
        else:
            half = RD // 2
            partner = tl.where(d < half, d + half, d - half)
            sign = tl.where(d < half, -1.0, 1.0)
        rot = d < RD
        xp = tl.load(src + partner, mask=live & rot, other=0.0).to(tl.float32)
        if QK_NORM:
            dd = d + j * 0
            w = tl.where(is_q, tl.load(qw_ptr + dd, mask=live, other=0.0), tl.load(kw_ptr + dd, mask=live, other=0.0))
            pp = partner + j * 0
            wp = tl.where(is_q, tl.load(qw_ptr + pp, mask=live & rot, other=0.0),
                          tl.load(kw_ptr + pp, mask=live & rot, other=0.0))
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HD + eps)[:, None]
            x = (w.to(tl.float32) * (x * rstd).to(ty).to(tl.float32)).to(ty).to(tl.float32)
            xp = (wp.to(tl.float32) * (xp * rstd).to(ty).to(tl.float32)).to(ty).to(tl.float32)
        c = tl.load(cos_ptr + b * stride_cb + t * stride_ct + d, mask=(d < RD), other=1.0).to(tl.float32)
        s = tl.load(sin_ptr + b * stride_cb + t * stride_ct + d, mask=(d < RD), other=0.0).to(tl.float32)
        if ROUND_EACH:
            y = (x * c).to(ty).to(tl.float32) + (sign * xp * s).to(ty).to(tl.float32)
        else:
            y = x * c + sign * xp * s
        y = tl.where(rot, y, x).to(ty)
        tl.store(q_ptr + b * sq_b + j * sq_h + t * sq_t + d, y, mask=live & is_q)
        if HAS_ROWS:
            r = tl.load(rows_ptr + b)
        else:
            r = b
        if HAS_IDX:
            p = tl.load(idx_ptr + tok)
        else:
            p = t
        kvh = tl.where(is_q, 0, j - H)
        is_k = live & (j >= H)
        dst = r * sk_r + kvh * sk_h + p * sk_s + d
        tl.store(k_ptr + dst, y, mask=is_k)
        v = tl.load(src + KV * HD + d, mask=is_k, other=0.0)  # the v head sits KV heads after its k head
        tl.store(v_ptr + dst, v, mask=is_k)


def head_rotary_reference(qkv, heads, kv_heads, head_dim, cos, sin, style, q_norm=None, k_norm=None, eps=1e-6):
    """Split a fused projection [B, T, (H + 2KV)·hd] into q [B, H, T, hd], k, v [B, KV, T, hd]; norm and rotate q, k.

    cos/sin [.., T, rd] broadcastable to [B, 1, T, rd] (rd <= hd: the first rd dims rotate).
    """
    b, t, _ = qkv.shape
    q, k, v = qkv.view(b, t, heads + 2 * kv_heads, head_dim).split([heads, kv_heads, kv_heads], dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if q_norm is not None:
        q, k = rms_norm_reference(q, q_norm, eps), rms_norm_reference(k, k_norm, eps)
    rd = cos.shape[-1]
    if cos.dim() == 2:
        cos, sin = cos[None, None], sin[None, None]
    elif cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    rot = apply_interleaved_rotary if style == RotaryStyle.INTERLEAVED_FP32 else apply_rotary
    if rd == head_dim:
        return rot(q, cos, sin), rot(k, cos, sin), v
    return (torch.cat((rot(q[..., :rd], cos, sin), q[..., rd:]), dim=-1),
            torch.cat((rot(k[..., :rd], cos, sin), k[..., rd:]), dim=-1), v)


def head_rotary(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor,
                style, *, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None, eps: float = 1e-6,
                k_out: torch.Tensor | None = None, v_out: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                index: torch.Tensor | None = None, kernels: Kernels):
    """q [B, H, T, hd] (and k, v) from a fused projection qkv [B, T, (H + 2KV)·hd].

    cos/sin: [T, rd] (shared by the batch) or [B, T, rd] / [B, 1, T, rd]; the first rd dims of each q/k
    head rotate (`style`), after a per-head RMSNorm when q_norm/k_norm are given (thinker). Without
    k_out the function returns (q, k, v) with k, v [B, KV, T, hd]. With k_out/v_out (caches
    [R, KV, S, hd]) k and v are written at [rows[b], :, index[b, t]] (rows default b, index default t)
    and (q, None, None) is returned. The Triton kernel runs where `kernels` applies, else the reference.
    """
    b, t, width = qkv.shape
    if not kernels.applies(qkv) or width != (heads + 2 * kv_heads) * head_dim:
        q, k, v = head_rotary_reference(qkv, heads, kv_heads, head_dim, cos, sin, style, q_norm, k_norm, eps)
        if k_out is None:
            return q, k, v
        _scatter_cache(k_out, v_out, k, v, rows, index)
        return q, None, None
    qkv = qkv if qkv.stride(-1) == 1 and qkv.stride(0) == t * qkv.stride(1) else qkv.contiguous()
    rd = cos.shape[-1]
    if cos.dim() == 4:
        cos, sin = cos[:, 0], sin[:, 0]
    if cos.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    stride_cb = 0 if cos.dim() == 2 else cos.stride(0)
    stride_ct = cos.stride(-2)
    q = torch.empty(b, heads, t, head_dim, device=qkv.device, dtype=qkv.dtype)
    returned = k_out is None
    if returned:
        k_out = torch.empty(b, kv_heads, t, head_dim, device=qkv.device, dtype=qkv.dtype)
        v_out = torch.empty_like(k_out)
    norm = q_norm is not None
    interleaved, round_each = style
    per = triton.next_power_of_2(heads + kv_heads)
    split = step_plan().rotary_heads
    if split and t == 1:  # a decode step: the token's heads over several programs
        per = min(per, split)
    _head_rotary_kernel[(b * t, triton.cdiv(heads + kv_heads, per))](
        qkv, cos, sin, q_norm if norm else qkv, k_norm if norm else qkv, q, k_out, v_out,
        rows if rows is not None else qkv, index if index is not None else qkv,
        t, heads, kv_heads, eps, qkv.stride(1), stride_cb, stride_ct,
        q.stride(0), q.stride(1), q.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
        HD=head_dim, RD=rd, BLOCK=triton.next_power_of_2(head_dim), HEADS=per,
        INTERLEAVED=bool(interleaved), ROUND_EACH=bool(round_each), QK_NORM=norm, HAS_ROWS=rows is not None,
        HAS_IDX=index is not None, num_warps=4, **pdl.launch(qkv))
    return (q, k_out, v_out) if returned else (q, None, None)


def _scatter_cache(k_out, v_out, k, v, rows, index) -> None:
    """Reference cache write: k, v [B, KV, T, hd] into [R, KV, S, hd] at [rows[b], :, index[b, t]]."""
    b, kvh, t, hd = k.shape
    r = rows if rows is not None else torch.arange(b, device=k.device)
    idx = index if index is not None else torch.arange(t, device=k.device).expand(b, t)
    where = (r[:, None, None], torch.arange(kvh, device=k.device)[None, :, None], idx[:, None, :])
    k_out.index_put_(where, k)
    v_out.index_put_(where, v)
