"""One-shot all-reduce through PyTorch symmetric memory, for the small all-reduces of tensor-parallel decode.

A decode step of the TP thinker does two all-reduces per layer of a few KiB each ([B, 1, hidden]); there NCCL's
per-call latency, not bandwidth, is the cost. With symmetric memory every rank maps its peers' buffers (CUDA IPC,
NVLink peer access; no NVLink multicast is used), so one kernel copies the local input into this rank's buffer,
waits on a barrier of signal flags and sums every rank's buffer into the output (`one_shot_all_reduce_copy_out`):
no NCCL launch, no host synchronisation, capturable in a CUDA graph.

Messages above `max_bytes` (prefill chunks) return None and take NCCL: a one-shot kernel reads every peer's whole
message, which stops paying off once bandwidth, not latency, is the cost.

Every rank must build one with the same arguments (the buffer's rendezvous is collective) and call it for the same
messages in the same order, as every tensor-parallel collective must.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

__all__ = ["DEFAULT_MAX_BYTES", "OneShotAllReduce"]

DEFAULT_MAX_BYTES = 1 << 20  # 1 MiB: a [128, hidden 4096] bf16 decode batch


class OneShotAllReduce:
    """Sum-all-reduce of small contiguous tensors of one dtype over `group` (None: the default group)."""

    def __init__(self, device: torch.device | str, dtype: torch.dtype, group=None,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"the one-shot all-reduce needs CUDA tensors, got device {device}")
        if max_bytes < dtype.itemsize:
            raise ValueError(f"max_bytes={max_bytes} holds no {dtype} element")
        group = group if group is not None else dist.group.WORLD
        self.group_name = group.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed by older releases, a no-op in newer ones
            with warnings.catch_warnings():  # newer releases deprecate it (FutureWarning): nothing to tell the operator
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(self.group_name)
        self.dtype = dtype
        self.buffer = symm_mem.empty(max_bytes // dtype.itemsize, dtype=dtype, device=device)
        symm_mem.rendezvous(self.buffer, self.group_name)
        self._check(group)

    @property
    def max_numel(self) -> int:
        return self.buffer.numel()

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        """Sum of `x` over the ranks as a new tensor, or None where this path does not take `x` (use NCCL)."""
        if x.dtype != self.dtype or x.numel() > self.buffer.numel() or not x.is_contiguous() or x.numel() == 0:
            return None
        out = torch.empty_like(x)
        view = self.buffer[: x.numel()].view_as(x)
        return torch.ops.symm_mem.one_shot_all_reduce_copy_out(view, x, "sum", self.group_name, out)

    def _check(self, group) -> None:
        """One collective sum at build time: fails loudly (every rank) instead of serving wrong sums later."""
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        probe = torch.full((8,), float(rank + 1), dtype=self.dtype, device=self.buffer.device)
        got = self(probe)
        want = world * (world + 1) / 2
        if got is None or not torch.all(got == want).item():
            raise RuntimeError(f"one-shot all-reduce self-check failed on rank {rank}: {got} != {want}")
