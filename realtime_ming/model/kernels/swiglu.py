"""SwiGLU `silu(gate) * up` of a fused gate|up projection as one Triton kernel (the reference's two
roundings: silu(gate) to the activation dtype, then the product).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .selection import Kernels
from .triton_import import tl, triton

__all__ = ["silu_mul"]

if triton is not None:

    @triton.jit
    def _silu_mul_kernel(x_ptr, y_ptr, n, stride_x, stride_y, BLOCK: tl.constexpr):
        """y = round(round(silu(gate)) * up) for one row of x = [gate | up]."""
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = col < n
        ty = y_ptr.dtype.element_ty
        g = tl.load(x_ptr + row * stride_x + col, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * stride_x + n + col, mask=ok, other=0.0).to(tl.float32)
        a = (g / (1.0 + tl.exp(-g))).to(ty).to(tl.float32)
        tl.store(y_ptr + row * stride_y + col, (a * u).to(ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, *, kernels: Kernels) -> torch.Tensor:
    """silu(gate) * up for gate_up = [..., gate | up] (the two halves of a fused projection)."""
    n = gate_up.shape[-1] // 2
    if not kernels.applies(gate_up):
        gate, up = gate_up.split(n, dim=-1)
        return F.silu(gate) * up
    xs = gate_up.reshape(-1, gate_up.shape[-1])
    if xs.stride(-1) != 1:
        xs = xs.contiguous()
    y = torch.empty(*gate_up.shape[:-1], n, device=gate_up.device, dtype=gate_up.dtype)
    block = min(1024, triton.next_power_of_2(n))
    _silu_mul_kernel[(xs.shape[0], triton.cdiv(n, block))](xs, y, n, xs.stride(0), n, BLOCK=block, num_warps=4)
    return y
