"""Triton, or None where it is not installed (CPU-only installs): the one place the kernels import it."""

from __future__ import annotations

try:  # the GPU machines have Triton; CPU-only installs may not
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU-only machines
    triton = None
    tl = None

__all__ = ["tl", "triton"]
