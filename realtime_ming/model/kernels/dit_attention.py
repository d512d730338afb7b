"""The DiT / aggregator attention of the talker's CFM sampler (rotary + attention + head merge) as one
Triton launch.

A DiT block's attention over its short sequence (1 condition + 32 history + 4 patch tokens, or the
aggregator's 5) was four kernels per call on a GPU — the rotary of q and k, cuDNN's attention with
its memset, and the copy that merges the heads back — ~11 µs of a ~39 µs block, 88 blocks per talker
step. Here one program per (row, head) — per block of 16 queries when there are few pairs — reads its
q, k, v straight from the fused projection
[B, T, 3·D], rotates q and k (interleaved pairs, fp32, rounded once: `RotaryStyle.INTERLEAVED_FP32`),
runs the whole T x T attention in registers (T <= 128) and writes its head's slice of the merged
output [B, T, D], so the output projection reads it as is.

Numerics: q, k rounded to the activation dtype after the rotary (as `rotary.head_rotary`), scores
and softmax in fp32, the unnormalised probabilities rounded to the activation dtype for the P·V
product and the sum divided out last (as flash attention does). Dispatch by the model's
`Kernels` (`applies`: CUDA tensors, or CPU tensors in Triton's interpreter); anything else, and shapes
outside the kernel's range, take the reference path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .rotary import RotaryStyle, head_rotary
from .selection import REFERENCE, Kernels, interpreting
from .triton_import import tl, triton

__all__ = ["MAX_TOKENS", "fits", "rotary_attention", "rotary_attention_reference"]

MAX_TOKENS = 128  # the whole score tile lives in registers
_BLOCK_M = 16  # query rows per program: (row, head, query block) programs, 96 for one CFG pair of 37 tokens
_SPLIT_BELOW = 256  # (row, head) pairs below which the queries are split into blocks of _BLOCK_M


def rotary_attention_reference(qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor, *,
                               kernels: Kernels = REFERENCE) -> torch.Tensor:
    """qkv [B, T, 3·D] -> bidirectional attention of the rotated heads, merged [B, T, D] (the PyTorch ops;
    the rotary by `rotary.head_rotary` under `kernels`, the path `rotary_attention` falls back to)."""
    b, t, width = qkv.shape
    d = width // 3
    q, k, v = head_rotary(qkv, heads, heads, d // heads, cos, sin, RotaryStyle.INTERLEAVED_FP32, kernels=kernels)
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)


def fits(qkv: torch.Tensor, heads: int, cos: torch.Tensor, *, kernels: Kernels) -> bool:
    """Whether the kernel serves this call: Triton dispatch, T <= MAX_TOKENS, a power-of-two head dim
    16..128 rotated whole, one cos/sin table [T, hd] for the batch."""
    b, t, width = qkv.shape
    hd = width // 3 // heads if heads else 0
    return (kernels.applies(qkv) and t <= MAX_TOKENS and width == 3 * heads * hd
            and 16 <= hd <= 128 and hd & (hd - 1) == 0 and cos.dim() == 2 and tuple(cos.shape) == (t, hd))


def rotary_attention(qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor,
                     *, kernels: Kernels) -> torch.Tensor:
    """`rotary_attention_reference` in one kernel where `fits` (else the reference)."""
    if not fits(qkv, heads, cos, kernels=kernels):
        return rotary_attention_reference(qkv, heads, cos, sin, kernels=kernels)
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
        PREC="ieee" if qkv.dtype == torch.float32 else "tf32", UPCAST=interpreting(), num_warps=4)
    return out


if triton is not None:

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
