"""Which kernels a model runs: the explicit, per-model kernel selection (no process-wide switch).

A `Kernels` value is chosen once, when a model is built (the engine picks `TRITON`; a model built
without one runs `REFERENCE`, the pure PyTorch Ming the fixtures check), and every module keeps it.
Each kernel entry point takes it (`kernels=`) and runs its Triton kernel only where the selection
`applies` to the tensor, else exactly the reference PyTorch math:

* `triton`: the fused Triton kernels (norms, rotary, SwiGLU, the thinker's decode/prefill attention,
  router and decode MoE, the DiT attention and CFM step) for CUDA tensors;
* `moe_experts`: the Triton MoE experts (`moe_experts.fused_experts`) for CUDA batches beyond the
  decode kernels (prefill); off, those run moe.py's PyTorch gather / grouped paths;
* `cpu_interpreter`: CPU tensors take the `triton` kernels too, in Triton's CPU interpreter (only
  with TRITON_INTERPRET=1 set before Triton is first imported): how CI checks on a machine without a
  GPU the very kernels a GPU runs.

Benchmarks A/B the two paths on one loaded model with `select_kernels` (a model too big to load twice).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from .triton_import import triton

__all__ = ["Kernels", "REFERENCE", "TRITON", "available", "interpreting", "select_kernels"]


def available() -> bool:
    """True when Triton imports (its kernels also need CUDA tensors unless TRITON_INTERPRET=1)."""
    return triton is not None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, tests)."""
    return triton is not None and os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Kernels:
    """The kernel selection of one model (frozen: hashable, picklable to tensor-parallel workers)."""

    triton: bool = False
    moe_experts: bool = False
    cpu_interpreter: bool = False

    def __post_init__(self) -> None:
        if self.cpu_interpreter and not self.triton:
            raise ValueError("cpu_interpreter runs the triton kernels on CPU: it needs triton=True")
        if self.cpu_interpreter and not interpreting():
            raise ValueError("cpu_interpreter needs Triton imported with TRITON_INTERPRET=1")

    def applies(self, t: torch.Tensor) -> bool:
        """True when the `triton` kernels serve tensor `t` (CUDA, or CPU in the interpreter)."""
        if not self.triton or triton is None:
            return False
        return t.is_cuda or (self.cpu_interpreter and interpreting())

    def on_device(self, device: torch.device | str) -> bool:
        """True when CUDA tensors on `device` take the `triton` kernels."""
        return self.triton and triton is not None and torch.device(device).type == "cuda"

    def experts_apply(self, t: torch.Tensor) -> bool:
        """True when the Triton MoE experts serve `t` (CUDA tensors only, as the kernels are tuned for)."""
        return self.moe_experts and triton is not None and t.is_cuda

    def on_cpu(self) -> "Kernels":
        """This selection with the triton kernels also on CPU tensors, in Triton's interpreter (tests)."""
        return Kernels(triton=True, moe_experts=self.moe_experts, cpu_interpreter=True)


REFERENCE = Kernels()  # the pure PyTorch ops everywhere
TRITON = Kernels(triton=True, moe_experts=True)  # what the engine serves with: every Triton kernel on CUDA


def select_kernels(model: nn.Module, kernels: Kernels) -> nn.Module:
    """Give every module of `model` that keeps a selection (a `kernels` attribute) the selection `kernels`;
    returns `model`. For A/B benchmarks and tests on one loaded model: CUDA graphs captured before keep the
    kernels they captured, so re-capture after switching."""
    if not isinstance(kernels, Kernels):
        raise TypeError(f"kernels must be a Kernels, got {type(kernels).__name__}")
    for module in model.modules():
        if isinstance(getattr(module, "kernels", None), Kernels):
            module.kernels = kernels
    return model
