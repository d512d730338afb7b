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
