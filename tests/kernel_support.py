"""What the Triton kernel tests share: where the kernels run on this machine, and the skip when they cannot.

On a GPU machine the kernels run compiled on CUDA tensors; elsewhere in Triton's CPU interpreter
(conftest sets TRITON_INTERPRET=1 before Triton is first imported). Nothing here is a test.
"""

from __future__ import annotations

import pytest
import torch

from realtime_ming.model.kernels import Kernels, interpreting

NEEDS_TRITON = pytest.mark.skipif(
    not (torch.cuda.is_available() or interpreting()),
    reason="needs a CUDA GPU, or Triton's CPU interpreter (Triton >= 3.7 installed; conftest turns it on)")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]
# the Triton kernels on this machine's tensors: compiled on CUDA, else in the CPU interpreter
ON = Kernels(triton=True, cpu_interpreter=DEVICE == "cpu" and interpreting())


def kernel_tol(dtype) -> float:
    """Relative L2 bound of a kernel against the same math in PyTorch: fp32 exact; bf16 1e-2 on the GPU, 4e-2 in
    the interpreter (it truncates fp32 -> bf16 at every rounding point where the GPU rounds to nearest, a bias
    that compounds to ~2 % over a chain)."""
    if dtype == torch.float32:
        return 1e-5
    return 1e-2 if DEVICE == "cuda" else 4e-2


def seeded_randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)


def rel_err(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())
