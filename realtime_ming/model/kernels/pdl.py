"""Programmatic dependent launch (PDL) of the decode step's Triton kernels, where the step plan turns it on.

A decode step at one row is ~380 short kernels; between two of them the GPU idles while the next one launches and
its programs ramp up, and the last programs of each (its tail) run on an almost empty GPU. With PDL (Hopper and
later) a kernel launched with `launch_pdl=True` may start as soon as every program of the kernel before it has
called `gdc_launch_dependents` (or ended), and its own `gdc_wait` blocks until that kernel has completed with
its memory visible. So a kernel here, with its constexpr `PDL` set:

* calls `release(PDL)` (gdc_launch_dependents) first, so the next kernel's programs can launch early;
* before `wait(PDL)` reads only what no kernel of the step writes: weights, their scales (the weight-streaming
  kernels load their first K chunk there, the bytes that overlap the kernel before);
* calls `wait(PDL)` in every program before it reads an activation, an index, anything an earlier kernel writes,
  and before it writes anything (an output buffer may be memory an earlier kernel still reads).

Every program waits, so a kernel completes only after the one before it did: ordering stays transitive along the
chain, and a kernel launched without PDL (cuBLAS, PyTorch ops) waits for everything before it as always. Stream
capture records a PDL launch as a programmatic edge (CUDA >= 12.3), so a captured CUDA graph keeps the overlap
(Triton's PDL tutorial times it with `do_bench_cudagraph`: triton-lang/triton#6394).

The kernels with a `PDL` switch: the dense GEMV (`dense_gemv`), the FP8 decode GEMVs (`moe_fp8`: gate|up, down,
down with a token's experts in one tile), the router's logits and selection (`moe_decode.route`), RMSNorm (`norm`),
the fused rotary (`rotary`) and the decode attention (`slot_attention`); the rest (cuBLAS, PyTorch ops, the prefill
and model-dtype expert kernels) launch as before.

`launch(t)` gives a kernel launch's PDL arguments: `{"PDL": True, "launch_pdl": True}` where `step_plan().pdl` is
on, t is a CUDA tensor on a device of compute capability >= 9 and this Triton has the grid dependency controls;
else `{"PDL": False}`: the kernel compiles without any of it (Triton's CPU interpreter never sees a gdc call).
"""

from __future__ import annotations

import functools

import torch

from .selection import interpreting
from .step_plan import step_plan
from .triton_import import tl, triton

__all__ = ["begin", "launch", "release", "supported", "wait"]

try:  # Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # older Triton, or none
    gdc_launch_dependents = gdc_wait = None


@functools.lru_cache(maxsize=None)
def _device_supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def supported(device: torch.device) -> bool:
    """True when kernels on `device` can launch with PDL (CUDA, compute capability >= 9, Triton's gdc ops)."""
    return (gdc_wait is not None and device.type == "cuda" and not interpreting()
            and _device_supports(device.index if device.index is not None else torch.cuda.current_device()))


def launch(t: torch.Tensor) -> dict:
    """The PDL launch arguments of a kernel over tensor `t` (see the module docstring)."""
    if step_plan().pdl and supported(t.device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


if triton is not None:

    @triton.jit
    def wait(PDL: tl.constexpr):
        """With PDL: block until the kernel before has completed and its writes are visible."""
        if PDL:
            gdc_wait()

    @triton.jit
    def release(PDL: tl.constexpr):
        """With PDL: let the next kernel launch (once every program of this one has called this, or ended)."""
        if PDL:
            gdc_launch_dependents()

    @triton.jit
    def begin(PDL: tl.constexpr):
        """`release` then `wait`: a kernel that reads nothing before the kernel before has completed."""
        release(PDL)
        wait(PDL)
else:  # pragma: no cover - CPU-only installs
    begin = release = wait = None
