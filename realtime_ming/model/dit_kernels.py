"""Triton kernels of the talker's CFM sampler: the DiT / aggregator attention (rotary + attention + head
merge) and the guided Euler + SDE-noise update, one launch each.

A DiT block's attention over its short sequence (1 condition + 32 history + 4 patch tokens, or the
aggregator's 5) was four kernels per call on a GPU — the rotary of q and k, cuDNN's attention with
its memset, and the copy that merges the heads back — ~11 µs of a ~39 µs block, 88 blocks per talker
step. Here one program per (row, head) — per block of 16 queries when there are few pairs — reads its q, k, v straight from the fused projection
[B, T, 3·D], rotates q and k (interleaved pairs, fp32, rounded once: `RotaryStyle.INTERLEAVED_FP32`),
runs the whole T x T attention in registers (T <= 128) and writes its head's slice of the merged
output [B, T, D], so the output projection reads it as is.

Numerics: q, k rounded to the activation dtype after the rotary (as `fused.head_rotary`), scores
and softmax in fp32, the unnormalised probabilities rounded to the activation dtype for the P·V
product and the sum divided out last (as flash attention does). Dispatch as in `fused`:
CUDA tensors with Triton, CPU tensors in Triton's interpreter under `fused.interpret_on_cpu()`;
anything else, and shapes outside the kernel's range, take the reference path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import fused

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU-only machines
    triton = None

__all__ = ["rotary_attention", "rotary_attention_reference", "fits", "cfm_step", "cfm_step_reference"]

MAX_TOKENS = 128  # the whole score tile lives in registers
_BLOCK_M = 16  # query rows per program: (row, head, query block) programs, 96 for one CFG pair of 37 tokens
_SPLIT_BELOW = 256  # (row, head) pairs below which the queries are split into blocks of _BLOCK_M


def rotary_attention_reference(qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """qkv [B, T, 3·D] -> bidirectional attention of the rotated heads, merged [B, T, D] (the PyTorch ops)."""
    b, t, width = qkv.shape
    d = width // 3
    q, k, v = fused.head_rotary(qkv, heads, heads, d // heads, cos, sin, fused.RotaryStyle.INTERLEAVED_FP32)
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)


def fits(qkv: torch.Tensor, heads: int, cos: torch.Tensor, force: bool = False) -> bool:
    """Whether the kernel serves this call: Triton dispatch, T <= MAX_TOKENS, a power-of-two head dim
    16..128 rotated whole, one cos/sin table [T, hd] for the batch."""
    b, t, width = qkv.shape
    hd = width // 3 // heads if heads else 0
    return (fused.use_triton(qkv, force) and t <= MAX_TOKENS and width == 3 * heads * hd
            and 16 <= hd <= 128 and hd & (hd - 1) == 0 and cos.dim() == 2 and tuple(cos.shape) == (t, hd))


def rotary_attention(qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor,
                     force: bool = False) -> torch.Tensor:
    """`rotary_attention_reference` in one kernel where `fits` (else the reference)."""
    if not fits(qkv, heads, cos, force):
        return rotary_attention_reference(qkv, heads, cos, sin)
    b, t, width = qkv.shape
    d = width // 3
    hd = d // heads
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    out = torch.empty(b, t, d, device=qkv.device, dtype=qkv.dtype)
    block_t = max(16, triton.next_power_of_2(t))
    # few (row, head) pairs: split the queries so more programs run (B=1: 96 instead of 32); many: one program
    # per pair, so each head's keys are rotated once (H100, B=16: 33 us per call with the split)
    block_m = _BLOCK_M if b * heads < _SPLIT_BELOW else block_t
    _rotary_attention_kernel[(b * heads, triton.cdiv(t, block_m))](
        qkv, cos, sin, out, t, heads, d, 1.0 / math.sqrt(hd), qkv.stride(0), qkv.stride(1), out.stride(0),
        out.stride(1), HD=hd, BLOCK_M=block_m, BLOCK_T=block_t,
        PREC="ieee" if qkv.dtype == torch.float32 else "tf32", UPCAST=fused.interpreting(), num_warps=4)
    return out


def cfm_step_reference(y: torch.Tensor, both: torch.Tensor, dt: torch.Tensor, cfg: torch.Tensor,
                       noise_scale: torch.Tensor, rnd: torch.Tensor) -> torch.Tensor:
    """One sampler step (docs/model.md §5.6): v = v_c + (v_c − v_u)·cfg from the DiT's [cond ; uncond] rows
    both [2B, P, C]; y [B, P, C] + v·dt, then + noise_scale·sqrt(|dt|)·rnd. cfg, noise_scale [B, 1, 1]
    (or broadcastable); dt a 0-d tensor. The reference's op order and roundings."""
    v_c, v_u = both.chunk(2, dim=0)
    y = y + (v_c + (v_c - v_u) * cfg) * dt
    return y + noise_scale * (dt.abs() ** 0.5) * rnd


def cfm_step(y: torch.Tensor, both: torch.Tensor, dt: torch.Tensor, cfg: torch.Tensor, noise_scale: torch.Tensor,
             rnd: torch.Tensor, force: bool = False) -> torch.Tensor:
    """`cfm_step_reference` in one kernel (fp32 arithmetic, rounded once) on CUDA; else the reference.
    Replaces ~11 elementwise launches per step (10 steps per talker step)."""
    b = y.shape[0]
    if (not fused.use_triton(y, force) or not (y.is_contiguous() and both.is_contiguous() and rnd.is_contiguous())
            or both.shape[0] != 2 * b or cfg.numel() not in (1, b) or noise_scale.numel() not in (1, b)):
        return cfm_step_reference(y, both, dt, cfg, noise_scale, rnd)
    out = torch.empty_like(y)
    n, per_row = y.numel(), y[0].numel()
    block = 1024
    _cfm_step_kernel[(triton.cdiv(n, block),)](
        y, both, dt.reshape(1), cfg.reshape(-1).contiguous(), noise_scale.reshape(-1).contiguous(), rnd, out,
        n, per_row, CFG_ROWS=cfg.numel(), NOISE_ROWS=noise_scale.numel(), BLOCK=block, num_warps=4)
    return out


if triton is not None:

    @triton.jit(do_not_specialize=['n'])
    def _cfm_step_kernel(y_ptr, both_ptr, dt_ptr, cfg_ptr, ns_ptr, rnd_ptr, out_ptr, n, per_row,
                         CFG_ROWS: tl.constexpr, NOISE_ROWS: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = i < n
        row = i // per_row
        dt = tl.load(dt_ptr).to(tl.float32)
        if CFG_ROWS > 1:
            cfg = tl.load(cfg_ptr + row, mask=live, other=0.0).to(tl.float32)
        else:
            cfg = tl.load(cfg_ptr).to(tl.float32)
        if NOISE_ROWS > 1:
            ns = tl.load(ns_ptr + row, mask=live, other=0.0).to(tl.float32)
        else:
            ns = tl.load(ns_ptr).to(tl.float32)
        v_c = tl.load(both_ptr + i, mask=live, other=0.0).to(tl.float32)
        v_u = tl.load(both_ptr + n + i, mask=live, other=0.0).to(tl.float32)  # the unconditional half
        y = tl.load(y_ptr + i, mask=live, other=0.0).to(tl.float32)
        r = tl.load(rnd_ptr + i, mask=live, other=0.0).to(tl.float32)
        y = y + (v_c + (v_c - v_u) * cfg) * dt + ns * tl.sqrt(tl.abs(dt)) * r
        tl.store(out_ptr + i, y.to(out_ptr.dtype.element_ty), mask=live)

    @triton.jit
    def _rotary_attention_kernel(qkv_ptr, cos_ptr, sin_ptr, out_ptr, T, H, D, scale,
                                 stride_qb, stride_qt, stride_ob, stride_ot,
                                 HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr, PREC: tl.constexpr,
                                 UPCAST: tl.constexpr):
        """One (row, head, block of BLOCK_M queries): rotate its q and the head's k, softmax(q·kᵀ·scale)·v over
        the T tokens, store its slice."""
        pid = tl.program_id(0).to(tl.int64)
        b = pid // H
        h = pid % H
        ty = out_ptr.dtype.element_ty
        m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]  # query tokens
        t = tl.arange(0, BLOCK_T)[:, None]  # key tokens
        d = tl.arange(0, HD)[None, :]
        live_m = m < T
        live = t < T
        src = qkv_ptr + b * stride_qb + h * HD
        partner = d ^ 1  # interleaved pairs (2j, 2j+1): rot(x)[2j] = -x[2j+1], rot(x)[2j+1] = x[2j]
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
        cm = tl.load(cos_ptr + m * HD + d, mask=live_m, other=1.0)
        sm = tl.load(sin_ptr + m * HD + d, mask=live_m, other=0.0)
        q = tl.load(src + m * stride_qt + d, mask=live_m, other=0.0).to(tl.float32)
        qp = tl.load(src + m * stride_qt + partner, mask=live_m, other=0.0).to(tl.float32)
        q = (q * cm + sign * qp * sm).to(ty)
        c = tl.load(cos_ptr + t * HD + d, mask=live, other=1.0)
        s = tl.load(sin_ptr + t * HD + d, mask=live, other=0.0)
        src = src + t * stride_qt
        k = tl.load(src + D + d, mask=live, other=0.0).to(tl.float32)
        kp = tl.load(src + D + partner, mask=live, other=0.0).to(tl.float32)
        k = (k * c + sign * kp * s).to(ty)
        v = tl.load(src + 2 * D + d, mask=live, other=0.0)
        if UPCAST:  # Triton's CPU interpreter mis-multiplies bf16 operands: the same rounded values in fp32
            q, k, v = q.to(tl.float32), k.to(tl.float32), v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PREC)
        cols = tl.arange(0, BLOCK_T)[None, :]
        scores = tl.where(cols < T, scores * scale, float("-inf"))
        p = tl.exp(scores - tl.max(scores, axis=1)[:, None])
        total = tl.sum(p, axis=1)[:, None]
        p = p.to(ty)  # rounded to the activation dtype before P·V, as flash attention does
        if UPCAST:
            p = p.to(tl.float32)
        o = tl.dot(p, v, input_precision=PREC)
        tl.store(out_ptr + b * stride_ob + m * stride_ot + h * HD + d, (o / total).to(ty), mask=live_m)
