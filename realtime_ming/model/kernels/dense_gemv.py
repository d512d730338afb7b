"""Dense projections of a decode batch (a few rows) as one Triton GEMV launch, where the step plan picks it.

At one to eight rows a projection is a weight read: cuBLAS's GEMM kernels for these shapes reach ~3 TB/s of an
H200's ~4.8 (bench/results/gpu-h200-fp8-decode-2026-11-29: the dense GEMMs are a third of the bs=1 step). The
GEMV reads the weight once for every row of the batch, in tiles of `n` output rows x `k` columns per program,
its loads software-pipelined `stages` deep (the FP8 expert GEMVs gained 11-20 % from that); with `dot` the
rows (padded to 16) multiply on the tensor cores, else in fp32 registers. Sums in fp32, rounded once to the
model dtype, as cuBLAS (the order of the sum differs: the result may differ from cuBLAS's in the last bit).

`linear` is F.linear's drop-in: the GEMV where `step_plan.STEP_PLAN` names a tile for this row count and shape
and the kernels apply (bf16/fp16 on CUDA, or the CPU interpreter), cuBLAS / PyTorch otherwise (a bias, fp32,
more rows than the plan covers, a weight not contiguous in its rows).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import pdl
from .selection import Kernels, interpreting
from .step_plan import step_plan
from .triton_import import tl, triton

__all__ = ["gemv", "linear"]

_DTYPES = (torch.bfloat16, torch.float16)
_DOT_ROWS = 16  # tl.dot's smallest M: the rows padded to it


if triton is not None:
    from .pdl import release, wait

    @triton.jit
    def _gemv_acc(acc, w, x, M_PAD: tl.constexpr, DOT: tl.constexpr, UPCAST: tl.constexpr):
        """acc plus one K chunk: x [M_PAD, BLOCK_K] times w [BLOCK_N, BLOCK_K]^T (the layouts of `_gemv_kernel`)."""
        if DOT:
            if UPCAST:  # Triton's CPU interpreter mis-multiplies bf16 operands: the same values in fp32
                acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc)
        elif M_PAD == 1:
            acc += w.to(tl.float32) * x.to(tl.float32)
        else:
            acc += w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]
        return acc

    @triton.jit(do_not_specialize=['M'])
    def _gemv_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y, M_PAD: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, DOT: tl.constexpr,
                     UPCAST: tl.constexpr, PDL: tl.constexpr):
        """y[m, n] = round(sum_k x[m, k] w[n, k]) for every row m < M and the BLOCK_N outputs of this program.
        PDL (pdl.py): the first K chunk of the weights is read before waiting for the kernel before."""
        release(PDL)
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        m = tl.arange(0, M_PAD)
        k = tl.arange(0, BLOCK_K)
        nok = n < N
        mok = m < M
        w_rows = w_ptr + n[:, None].to(tl.int64) * stride_w
        x_rows = x_ptr + m[:, None].to(tl.int64) * stride_x
        if DOT:
            acc = tl.zeros((M_PAD, BLOCK_N), tl.float32)
        elif M_PAD == 1:
            acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        else:
            acc = tl.zeros((M_PAD, BLOCK_N, BLOCK_K), tl.float32)
        if PDL:  # chunk 0 (the same sum order as the loop's first step)
            w = tl.load(w_rows + k[None, :], mask=nok[:, None] & (k < K)[None, :], other=0.0)
            wait(PDL)
            x = tl.load(x_rows + k[None, :], mask=mok[:, None] & (k < K)[None, :], other=0.0)
            acc = _gemv_acc(acc, w, x, M_PAD, DOT, UPCAST)
        for k0 in tl.range(BLOCK_K * PDL, K, BLOCK_K, num_stages=STAGES):
            kk = k0 + k
            kok = kk < K
            w = tl.load(w_rows + kk[None, :], mask=nok[:, None] & kok[None, :], other=0.0)
            x = tl.load(x_rows + kk[None, :], mask=mok[:, None] & kok[None, :], other=0.0)
            acc = _gemv_acc(acc, w, x, M_PAD, DOT, UPCAST)
        if DOT:
            y = acc
        elif M_PAD == 1:
            y = tl.sum(acc, axis=1)[None, :]
        else:
            y = tl.sum(acc, axis=2)
        tl.store(y_ptr + m[:, None].to(tl.int64) * stride_y + n[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=mok[:, None] & nok[None, :])


def gemv(x: torch.Tensor, weight: torch.Tensor, tile: dict) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T -> [..., N] in x's dtype, one launch with `tile` (step_plan's keys). The caller
    checks that it applies (`linear`); benchmarks call it directly."""
    k = x.shape[-1]
    n = weight.shape[0]
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    m = rows.shape[0]
    dot = bool(tile.get("dot"))
    m_pad = max(_DOT_ROWS, triton.next_power_of_2(m)) if dot else triton.next_power_of_2(m)
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    _gemv_kernel[(triton.cdiv(n, tile["n"]),)](
        rows, weight, y, m, n, k, rows.stride(0), weight.stride(0), y.stride(0), M_PAD=m_pad, BLOCK_N=tile["n"],
        BLOCK_K=tile["k"], STAGES=tile.get("stages", 1), DOT=dot, UPCAST=interpreting(), num_warps=tile["warps"],
        **pdl.launch(x))
    return y.view(*x.shape[:-1], n)


def _applies(x: torch.Tensor, weight: torch.Tensor, kernels: Kernels) -> bool:
    return (triton is not None and kernels.applies(x) and x.dtype in _DTYPES and weight.dtype == x.dtype
            and weight.dim() == 2 and weight.stride(-1) == 1 and x.shape[-1] == weight.shape[1] and x.numel() > 0)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           kernels: Kernels) -> torch.Tensor:
    """F.linear(x, weight, bias): the Triton GEMV where the step plan picks it for x's row count and the
    weight's shape (no bias, model dtype, the kernels apply), else F.linear itself."""
    plan = step_plan()
    if plan.gemv and bias is None and _applies(x, weight, kernels):  # an empty plan costs every projection one test
        tile = plan.gemv_tile(x.numel() // x.shape[-1], weight.shape[0], weight.shape[1])
        if tile is not None:
            return gemv(x, weight, tile)
    return F.linear(x, weight, bias)
