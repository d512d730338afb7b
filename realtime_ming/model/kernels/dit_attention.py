"""The DiT / aggregator attention of the talker's CFM sampler (rotary + attention + head merge) as one
Triton launch.

A DiT block's attention over its short sequence (1 condition + 32 history + 4 patch tokens, or the
aggregator's 5) was four kernels per call on a GPU — the rotary of q and k, cuDNN's attention with
its memset, and the copy that merges the heads back — ~11 µs of a ~39 µs block, 88 blocks per talker
step. Here one program per (row, head) reads its q, k, v straight from the fused projection [B, T, 3·D],
rotates q and k (interleaved pairs, fp32, rounded once: `RotaryStyle.INTERLEAVED_FP32`), runs the whole
T x T attention in registers (T <= 128) and writes its head's slice of the merged output [B, T, D], so the
output projection reads it as is. A block whose later layers need only its last positions (the DiT's last:
the patch) asks for those queries only (`queries`): it attends over all T keys and writes [B, queries, D].

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

__all__ = ["MAX_TOKENS", "fits", "launch_config", "rotary_attention", "rotary_attention_reference"]

MAX_TOKENS = 128  # the whole score tile lives in registers


def rotary_attention_reference(qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor, *,
                               kernels: Kernels = REFERENCE, queries: int | None = None) -> torch.Tensor:
    """qkv [B, T, 3·D] -> bidirectional attention of the rotated heads, merged [B, Q, D] for the last Q = `queries`
    query tokens (default all T) over all T keys (the PyTorch ops; the rotary by `rotary.head_rotary` under
    `kernels`, the path `rotary_attention` falls back to)."""
    b, t, width = qkv.shape
    d = width // 3
    q, k, v = head_rotary(qkv, heads, heads, d // heads, cos, sin, RotaryStyle.INTERLEAVED_FP32, kernels=kernels)
    nq = t if queries is None else queries
    return F.scaled_dot_product_attention(q[:, :, t - nq:], k, v).transpose(1, 2).reshape(b, nq, d)


def fits(qkv: torch.Tensor, heads: int, cos: torch.Tensor, *, kernels: Kernels) -> bool:
    """Whether the kernel serves this call: Triton dispatch, T <= MAX_TOKENS, a power-of-two head dim
    16..128 rotated whole, one cos/sin table [T, hd] for the batch."""
    b, t, width = qkv.shape
    hd = width // 3 // heads if heads else 0
    return (kernels.applies(qkv) and t <= MAX_TOKENS and width == 3 * heads * hd
            and 16 <= hd <= 128 and hd & (hd - 1) == 0 and cos.dim() == 2 and tuple(cos.shape) == (t, hd))


def launch_config(queries: int) -> tuple[int, int]:
    """(query rows per program, warps) for a call that computes `queries` query tokens per (row, head).

    One program per (row, head) with all its queries, each head's keys rotated once: more programs, each with a block
    of 16 queries, cost more at every talker shape (1x H200, 6 rows = 12 CFG rows x 37 tokens: 17.8 vs 10.4 us per
    call; 2 rows 7.8 vs 6.4). `bench/dit_attention_bench.py` sweeps the alternatives."""
    return max(16, triton.next_power_of_2(queries)), 4


def rotary_attention(qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor,
                     *, kernels: Kernels, queries: int | None = None) -> torch.Tensor:
    """`rotary_attention_reference` in one kernel where `fits` (else the reference). `queries`: only the last
    that many query tokens (a block whose later layers need only those positions)."""
    b, t, width = qkv.shape
    nq = t if queries is None else queries
    if not 0 < nq <= t:
        raise ValueError(f"queries must be in 1..{t}, got {queries}")
    if not fits(qkv, heads, cos, kernels=kernels):
        return rotary_attention_reference(qkv, heads, cos, sin, kernels=kernels, queries=queries)
    d = width // 3
    hd = d // heads
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    out = torch.empty(b, nq, d, device=qkv.device, dtype=qkv.dtype)
    block_t = max(16, triton.next_power_of_2(t))
    block_m, warps = launch_config(nq)
    _rotary_attention_kernel[(b * heads, triton.cdiv(nq, block_m))](
        qkv, cos, sin, out, t, t - nq, heads, d, 1.0 / math.sqrt(hd), qkv.stride(0), qkv.stride(1), out.stride(0),
        out.stride(1), HD=hd, BLOCK_M=block_m, BLOCK_T=block_t,
        SAME_TOKENS=nq == t and block_m == block_t,
        PREC="ieee" if qkv.dtype == torch.float32 else "tf32", UPCAST=interpreting(), num_warps=warps)
    return out


if triton is not None:

    @triton.jit
    def _rotary_attention_kernel(qkv_ptr, cos_ptr, sin_ptr, out_ptr, T, Q0, H, D, scale,
                                 stride_qb, stride_qt, stride_ob, stride_ot,
                                 HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr,
                                 SAME_TOKENS: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
        """One (row, head, block of BLOCK_M queries from token Q0 on): rotate its q and the head's k,
        softmax(q·kᵀ·scale)·v over the T tokens, store its slice (output row = query token - Q0).
        SAME_TOKENS: the one query block is the key block (the rotary tables are loaded once)."""
        pid = tl.program_id(0).to(tl.int64)
        b = pid // H
        h = pid % H
        ty = out_ptr.dtype.element_ty
        m = Q0 + tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]  # query tokens
        t = tl.arange(0, BLOCK_T)[:, None]  # key tokens
        d = tl.arange(0, HD)[None, :]
        live_m = m < T
        live = t < T
        src = qkv_ptr + b * stride_qb + h * HD
        partner = d ^ 1  # interleaved pairs (2j, 2j+1): rot(x)[2j] = -x[2j+1], rot(x)[2j+1] = x[2j]
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
        c = tl.load(cos_ptr + t * HD + d, mask=live, other=1.0)
        s = tl.load(sin_ptr + t * HD + d, mask=live, other=0.0)
        if SAME_TOKENS:
            cm, sm = c, s
        else:
            cm = tl.load(cos_ptr + m * HD + d, mask=live_m, other=1.0)
            sm = tl.load(sin_ptr + m * HD + d, mask=live_m, other=0.0)
        q = tl.load(src + m * stride_qt + d, mask=live_m, other=0.0).to(tl.float32)
        qp = tl.load(src + m * stride_qt + partner, mask=live_m, other=0.0).to(tl.float32)
        q = (q * cm + sign * qp * sm).to(ty)
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
        tl.store(out_ptr + b * stride_ob + (m - Q0) * stride_ot + h * HD + d, (o / total).to(ty), mask=live_m)
