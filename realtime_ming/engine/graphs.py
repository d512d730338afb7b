"""The one CUDA-graph capture utility of the runners: a step function graphed per batch bucket.

`BucketedGraph` owns static input buffers sized for the largest bucket (declared together as
`GraphInput`s), captures one graph per bucket largest-first into one shared memory pool, and on
`step()` picks the smallest bucket >= batch, copies the inputs in, writes each input's padding
value into the rows past the batch, replays and returns the outputs sliced to the batch.
Eager (the plain call) when `enforce_eager`, on CPU, or for a batch above the largest bucket.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

__all__ = ["BucketedGraph", "GraphInput", "pick_bucket", "upload"]

Outputs = torch.Tensor | tuple[torch.Tensor, ...]


@dataclass(frozen=True, slots=True)
class GraphInput:
    """One input of a graphed step: its shape at the LARGEST bucket, dtype, batch dim, padding value.

    batch_dim None = not batched (copied whole every step, e.g. a time grid). `pad` fills the rows
    past the real batch; choose a value the step treats as inert (position -1, active False).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    batch_dim: int | None = 0
    pad: float | int | bool = 0


@contextlib.contextmanager
def _no_gc():
    """No garbage collection until the capture ends: a collection in the middle could free unreachable CUDA
    objects (an old runner's graphs, events), and their CUDA calls invalidate the capture."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def upload(values, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A host list as a tensor on `device`, queued without a host sync: a CUDA copy goes through pinned memory
    (`torch.tensor(values, device=cuda)` copies from pageable memory, which waits for the stream's queued work)."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)


def pick_bucket(buckets: Sequence[int], batch: int) -> int | None:
    """Smallest bucket >= batch, or None when the batch exceeds every bucket."""
    fitting = [b for b in buckets if b >= batch]
    return min(fitting) if fitting else None


class BucketedGraph:
    """`fn(**inputs) -> Tensor | tuple[Tensor, ...]` replayed from per-bucket CUDA graphs.

    fn must be static-shape and host-sync-free; state it mutates (KV caches) must be addressed
    through its inputs so padding rows stay inert. Batched outputs carry the batch in
    `output_batch_dims` (one int for all, or one int/None per output). The returned tensors are
    views of graph memory: valid until the next `step()` of any graph in the same pool. A `pool`
    shared between instances must only be handed to graphs that live no longer than its first user
    (capturing into a pool whose graphs were all freed trips an allocator assertion).
    """

    def __init__(self, fn: Callable[..., Outputs], inputs: Mapping[str, GraphInput], buckets: Sequence[int], *,
                 device: torch.device | str, enforce_eager: bool = False,
                 output_batch_dims: int | Sequence[int | None] = 0, warmup: int = 2, pool=None):
        if not buckets or min(buckets) < 1:
            raise ValueError("buckets must be a non-empty list of positive batch sizes")
        batched = [n for n, s in inputs.items() if s.batch_dim is not None]
        if not batched:
            raise ValueError("at least one input must carry the batch (batch_dim not None)")
        top = max(buckets)
        for name in batched:
            spec = inputs[name]
            if spec.shape[spec.batch_dim] != top:
                raise ValueError(f"input {name!r}: batch dim {spec.batch_dim} of {spec.shape} must equal "
                                 f"the largest bucket {top}")
        self.fn, self.specs = fn, dict(inputs)
        self.buckets = tuple(sorted(set(buckets)))
        self.device = torch.device(device)
        self.eager = enforce_eager or self.device.type != "cuda"
        self.output_batch_dims = output_batch_dims
        self.warmup, self.pool = warmup, pool
        self._batched = batched
        self._static: dict[str, torch.Tensor] = {}
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, Outputs]] = {}

    @property
    def graphed(self) -> bool:
        """True once graphs are captured (never in eager mode)."""
        return bool(self._graphs)

    def release(self) -> None:
        """Free the captured graphs and their static buffers; later steps run eager (never recapture).

        A graph that captured a NCCL collective pins its communicator: NCCL cannot destroy the
        communicator while such a graph exists (`destroy_process_group` waits for it forever), so a
        tensor-parallel shard releases its graphs before it leaves the process group."""
        for graph, _ in self._graphs.values():
            graph.reset()
        self._graphs.clear()
        self._static = {}
        self.eager = True

    def _views(self, bucket: int) -> dict[str, torch.Tensor]:
        return {n: (t if self.specs[n].batch_dim is None else t.narrow(self.specs[n].batch_dim, 0, bucket))
                for n, t in self._static.items()}

    @torch.no_grad()
    def capture(self) -> None:
        """Allocate the static buffers (filled with padding) and capture every bucket, largest first."""
        if self.eager or self._graphs:
            return
        with torch.cuda.device(self.device):  # capture on THIS device's stream, whatever the thread's current device
            self._capture()

    def _capture(self) -> None:
        self._static = {n: torch.full(s.shape, s.pad, dtype=s.dtype, device=self.device) for n, s in self.specs.items()}
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        side, capture = torch.cuda.Stream(self.device), torch.cuda.Stream(self.device)
        gc.collect()  # what is already unreachable goes now, not in the middle of a capture (`_no_gc`)
        for bucket in sorted(self.buckets, reverse=True):
            args = self._views(bucket)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up off the capture: allocator, cuBLAS handles, Triton JIT
                for _ in range(self.warmup):
                    self.fn(**args)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # an explicit capture stream on this device: torch.cuda.graph's default one is created once, on
            # whichever device was current at its first use (a talker on cuda:1 would capture on cuda:0)
            with _no_gc(), torch.cuda.graph(graph, pool=self.pool, stream=capture):
                out = self.fn(**args)
            self._graphs[bucket] = (graph, out)
        torch.cuda.synchronize(self.device)

    def _batch_of(self, inputs: Mapping[str, torch.Tensor]) -> int:
        if set(inputs) != set(self.specs):
            raise ValueError(f"inputs {sorted(inputs)} != declared {sorted(self.specs)}")
        sizes = {n: inputs[n].shape[self.specs[n].batch_dim] for n in self._batched}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"batched inputs disagree on the batch size: {sizes}")
        return next(iter(sizes.values()))

    def _slice(self, out: Outputs, batch: int) -> Outputs:
        single = isinstance(out, torch.Tensor)
        outs = (out,) if single else tuple(out)
        dims = self.output_batch_dims
        dims = [dims] * len(outs) if isinstance(dims, int) or dims is None else list(dims)
        if len(dims) != len(outs):
            raise ValueError(f"{len(outs)} outputs but {len(dims)} output_batch_dims")
        sliced = tuple(o if d is None else o.narrow(d, 0, batch) for o, d in zip(outs, dims))
        return sliced[0] if single else sliced

    @torch.no_grad()
    def step(self, **inputs: torch.Tensor) -> Outputs:
        """Run the step for the given batch (graph replay when captured and a bucket fits)."""
        batch = self._batch_of(inputs)
        bucket = pick_bucket(self.buckets, batch)
        if self.eager or bucket is None:
            return self.fn(**inputs)
        if not self._graphs:
            self.capture()
        with torch.cuda.device(self.device):  # replay on this device's current stream
            return self._replay(bucket, batch, inputs)

    def _replay(self, bucket: int, batch: int, inputs: Mapping[str, torch.Tensor]) -> Outputs:
        for name, value in inputs.items():
            spec, buf = self.specs[name], self._static[name]
            if spec.batch_dim is None:
                buf.copy_(value)
                continue
            buf.narrow(spec.batch_dim, 0, batch).copy_(value)
            if batch < bucket:
                buf.narrow(spec.batch_dim, batch, bucket - batch).fill_(spec.pad)
        graph, out = self._graphs[bucket]
        graph.replay()
        return self._slice(out, batch)
