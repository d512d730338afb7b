"""Shared building blocks: RMSNorm, rotary helpers, tensor-parallel linears and embeddings.

Every layer here exists once. Tensor parallelism follows gpt-fast/nano-vllm:
a parallel layer knows its `TPGroup` at construction, its weight carries `tp_dim` (and
`tp_splits` for fused projections) so the loader narrows each checkpoint tensor to this rank,
and collectives happen only inside these layers. World size 1 runs the same code, no collectives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .kernels.dense_gemv import linear
from .kernels.norm import add_rms_norm, rms_norm
from .kernels.selection import REFERENCE, Kernels

__all__ = [
    "TPGroup",
    "RMSNorm",
    "rope_inv_freq",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "ParallelLMHead",
    "mark_tp",
    "concat_params",
    "prenorm_stack",
]


@dataclass(frozen=True)
class TPGroup:
    """Tensor-parallel placement of one process: rank, world size, and the NCCL group (None = default).

    `shadow=True` (benchmarks only) is one rank of a TP=size group alone on its GPU: shards have that
    rank's shapes and every collective is skipped (all_gather repeats the local part), so it costs
    one rank's compute of a deployment whose other GPUs are absent; its outputs are meaningless.
    """

    rank: int = 0
    size: int = 1
    group: Any = None
    shadow: bool = False
    # small all-reduces through symmetric memory (kernels/all_reduce.OneShotAllReduce; None: NCCL only). It
    # returns None for a message it does not take, which then goes to NCCL like every other.
    one_shot: Any = None

    def __post_init__(self):
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tp rank {self.rank} outside world size {self.size}")

    def divide(self, n: int, what: str) -> int:
        if n % self.size:
            raise ValueError(f"{what}={n} is not divisible by tensor-parallel size {self.size}")
        return n // self.size

    def heads(self, n: int, what: str) -> int:
        """Heads of `n` this rank holds: n/size, or 1 when there are fewer heads than ranks and the world
        size is a multiple of n (each rank then holds the head its query heads use: KV-head replication)."""
        if n % self.size == 0:
            return n // self.size
        if self.size % n:
            raise ValueError(f"{what}={n} neither divides nor is divisible by tensor-parallel size {self.size}")
        return 1

    def part_slice(self, part: int | tuple[int, int]) -> tuple[int, int]:
        """(start, length) of this rank's piece of one fused part along the split dim. `part` is its size
        (split evenly) or (size, heads): split by heads (`heads`), a replicated head when heads < size."""
        size, heads = part if isinstance(part, tuple) else (part, None)
        if self.size == 1:
            return 0, size
        if heads is None or heads % self.size == 0:
            local = self.divide(size, "output features")
            return self.rank * local, local
        self.heads(heads, "heads")
        local = size // heads
        return (self.rank * heads // self.size) * local, local

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the ranks: in place over NCCL, or a new tensor from the one-shot path."""
        if self.size > 1 and not self.shadow:
            if self.one_shot is not None:
                out = self.one_shot(x)
                if out is not None:
                    return out
            torch.distributed.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's `x` along the last dimension."""
        if self.size == 1:
            return x
        if self.shadow:
            return torch.cat([x] * self.size, dim=-1)
        parts = [torch.empty_like(x) for _ in range(self.size)]
        torch.distributed.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


SINGLE = TPGroup()


def mark_tp(param: nn.Parameter, dim: int | None, splits: tuple[int, ...] | None = None) -> nn.Parameter:
    """Tell the loader how to shard `param`: along `dim`, each of `splits` (full sizes) separately."""
    param.tp_dim = dim
    param.tp_splits = splits
    return param


class RMSNorm(nn.Module):
    """RMSNorm as in HF Qwen2/BailingMoeV2: normalise in fp32, cast back, then multiply the weight
    (one Triton kernel where `kernels` applies)."""

    def __init__(self, dim: int, eps: float = 1e-6, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.eps = eps
        self.kernels = kernels
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, kernels=self.kernels)

    def add(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + delta), x + delta): a residual add fused with the norm that follows it."""
        return add_rms_norm(x, delta, self.weight, self.eps, kernels=self.kernels)


def prenorm_stack(layers, x: torch.Tensor, input_norm, final_norm: "RMSNorm", step) -> torch.Tensor:
    """Run pre-norm residual blocks with every residual add fused into the norm that follows it.

    `input_norm(layer)` is a layer's first norm; `step(i, layer, x, h)` runs layer i on the residual
    stream x with h = its normed input and returns (x after its first residual add, the output still
    to add). Returns final_norm(x) after the last layer.
    """
    if not len(layers):
        return final_norm(x)
    h = input_norm(layers[0])(x)
    for i, layer in enumerate(layers):
        x, delta = step(i, layer, x, h)
        h, x = (input_norm(layers[i + 1]) if i + 1 < len(layers) else final_norm).add(x, delta)
    return h


def concat_params(owner: nn.Module, name: str, tensors: tuple[torch.Tensor, ...],
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """`torch.cat(tensors)` along dim 0 (cast to `dtype` if given), cached on `owner` until any of them
    changes (fused projections).

    The separate parameters stay the checkpoint's (names, loading, TP narrowing); the fused copy is
    rebuilt when one is reloaded or moved (its storage or version counter changes).
    """
    key = tuple((t.data_ptr(), t._version, t.device) for t in tensors)
    cached = owner.__dict__.get(name)
    if cached is not None and cached[0] == key:
        return cached[1]
    with torch.no_grad():
        value = torch.cat([t.detach() for t in tensors])
        if dtype is not None:
            value = value.to(dtype)
    owner.__dict__[name] = (key, value)
    return value


def rope_inv_freq(dim: int, theta: float, device=None) -> torch.Tensor:
    """HF default inverse frequencies theta^(-2j/dim), j < dim/2, in fp32."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))


class ColumnParallelLinear(nn.Module):
    """Linear whose output features are split across ranks; `splits` shards fused parts separately
    (an entry (size, heads) is split by heads, replicated when there are fewer heads than ranks).
    `kernels`: a decode batch's projection may run the step plan's Triton GEMV (`dense_gemv.linear`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, tp: TPGroup = SINGLE,
                 splits: tuple[int | tuple[int, int], ...] | None = None, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.kernels = kernels
        parts = splits or (out_features,)
        if sum(p[0] if isinstance(p, tuple) else p for p in parts) != out_features:
            raise ValueError("splits must sum to out_features")
        local = sum(tp.part_slice(p)[1] for p in parts)
        self.tp = tp
        self.weight = mark_tp(nn.Parameter(torch.empty(local, in_features)), 0, splits)
        self.bias = mark_tp(nn.Parameter(torch.empty(local)), 0, splits) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, kernels=self.kernels)


class RowParallelLinear(nn.Module):
    """Linear whose input features are split across ranks; the partial outputs are all-reduced.

    `reduce=False` leaves the partial sum for a caller that fuses several reductions into one
    (routed + shared experts share one all-reduce, issue 4). `kernels`: as ColumnParallelLinear's.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, tp: TPGroup = SINGLE,
                 reduce: bool = True, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.kernels = kernels
        self.tp = tp
        self.reduce = reduce
        self.weight = mark_tp(nn.Parameter(torch.empty(out_features, tp.divide(in_features, "input features"))), 1)
        # the bias is added once, after the reduction, so it is replicated
        self.bias = mark_tp(nn.Parameter(torch.empty(out_features)), None) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, kernels=self.kernels)
        if self.reduce:
            y = self.tp.all_reduce(y)
        if self.bias is not None:
            y = y + self.bias
        return y


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by vocabulary rows; out-of-shard ids contribute zeros, then all-reduce."""

    def __init__(self, num_embeddings: int, dim: int, tp: TPGroup = SINGLE):
        super().__init__()
        self.tp = tp
        self.num_embeddings = num_embeddings
        self.shard = tp.divide(num_embeddings, "vocab_size")
        self.weight = mark_tp(nn.Parameter(torch.empty(self.shard, dim)), 0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        start = self.tp.rank * self.shard
        local = ids - start
        valid = (local >= 0) & (local < self.shard)
        out = F.embedding(local.clamp(0, self.shard - 1), self.weight) * valid.unsqueeze(-1).to(self.weight.dtype)
        return self.tp.all_reduce(out)


class ParallelLMHead(nn.Module):
    """Output projection split by vocabulary; logits gathered so every rank sees the full row.
    `kernels`: as ColumnParallelLinear's."""

    def __init__(self, dim: int, vocab_size: int, tp: TPGroup = SINGLE, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.kernels = kernels
        self.tp = tp
        self.weight = mark_tp(nn.Parameter(torch.empty(tp.divide(vocab_size, "vocab_size"), dim)), 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_gather_last(linear(x, self.weight, kernels=self.kernels))
