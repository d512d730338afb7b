"""RMSNorm as one Triton kernel, with the residual add of a pre-norm block fused in (`add_rms_norm`).

A reference RMSNorm is six kernels; at serving batch sizes the launches, not the bytes, set the step
time. The kernel rounds where the reference rounds (the sum to the activation dtype, the normalised
value before the weight), so bf16 results agree with the reference to an ulp. The row count is
`do_not_specialize`: Triton would otherwise compile a new variant the first time a length is 1 or a
multiple of 16, a ~1 s stall in the middle of serving.
"""

from __future__ import annotations

import torch

from . import pdl
from .selection import Kernels
from .triton_import import tl, triton

__all__ = ["add_rms_norm", "rms_norm", "rms_norm_reference"]


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Qwen2 / BailingMoeV2: normalise in fp32, cast back to x's dtype, then times the weight."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


if triton is not None:
    from .pdl import begin

    @triton.jit(do_not_specialize=['m'])
    def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, m, n, eps, stride_x, stride_r, stride_y, stride_s,
                         HAS_RES: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        """y = w * round(s * rsqrt(mean(s^2) + eps)) with s = round(x + r) (or x) for ROWS rows; s stored
        when HAS_RES. PDL (pdl.py): waits first."""
        begin(PDL)
        row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
        offs = tl.arange(0, BLOCK)[None, :]
        ok = (row < m) & (offs < n)
        ty = y_ptr.dtype.element_ty
        s = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
        if HAS_RES:
            s = s + tl.load(r_ptr + row * stride_r + offs, mask=ok, other=0.0).to(tl.float32)
            s = s.to(ty).to(tl.float32)
            tl.store(s_ptr + row * stride_s + offs, s.to(ty), mask=ok)
        rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=1) / n + eps)
        xn = (s * rstd[:, None]).to(ty).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_y + offs, (w * xn).to(ty), mask=ok)


def _norm_launch(x: torch.Tensor, r: torch.Tensor | None, weight: torch.Tensor, eps: float):
    xs = _rows(x)
    if xs.stride(-1) != 1:
        xs = xs.contiguous()
    n = xs.shape[-1]
    y = torch.empty(xs.shape, device=x.device, dtype=x.dtype)
    if r is None:
        rs, s = xs, y
    else:
        rs = _rows(r)
        if rs.stride(-1) != 1:
            rs = rs.contiguous()
        s = torch.empty_like(y)
    block = triton.next_power_of_2(n)
    rows = max(1, min(16, 2048 // block))  # several short rows per program
    m = xs.shape[0]
    _rms_norm_kernel[(triton.cdiv(m, rows),)](xs, rs, weight, y, s, m, n, eps, xs.stride(0), rs.stride(0),
                                              y.stride(0), s.stride(0), HAS_RES=r is not None, ROWS=rows,
                                              BLOCK=block, num_warps=4 if block * rows <= 2048 else 8,
                                              **pdl.launch(xs))
    return y.view(x.shape), s.view(x.shape)


def _fusable_norm(x: torch.Tensor, weight: torch.Tensor, kernels: Kernels) -> bool:
    return kernels.applies(x) and x.dtype == weight.dtype and x.shape[-1] <= 16384 and x.numel() > 0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, kernels: Kernels) -> torch.Tensor:
    """RMSNorm over the last dim (reference math; one kernel on CUDA)."""
    if not _fusable_norm(x, weight, kernels):
        return rms_norm_reference(x, weight, eps)
    return _norm_launch(x, None, weight, eps)[0]


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 kernels: Kernels) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + delta), x + delta): the residual add of a pre-norm block fused into the next norm."""
    if not _fusable_norm(x, weight, kernels) or delta.shape != x.shape or delta.dtype != x.dtype:
        s = x + delta
        return rms_norm_reference(s, weight, eps), s
    return _norm_launch(x, delta, weight, eps)
