"""Tensor-parallel thinker: rank 0 lives in the engine, ranks 1..N-1 are worker processes.

Every thinker call on rank 0 (`embed`, the stack's `forward`, `logits`) is first published to the
workers with one `broadcast_object_list`, then run locally, so all ranks enter the same NCCL
collectives in the same order (nano-vllm's `call`). Only rank 0 samples. Each rank owns its own
KV-cache shard; the proxy swaps the caller's cache for the local one.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..model.config import CheckpointConfig
from ..model.layers import TPGroup
from ..model.loader import init_dummy, load_weights, read_weight_map
from ..model.thinker import Thinker, ThinkerKVCache

__all__ = ["TPLaunch", "ThinkerProxy", "start_tp"]

log = logging.getLogger(__name__)

# NVLink multicast stays off on shared hosts (device README); set before NCCL initialises
_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class TPLaunch:
    """What every rank needs to build its shard."""

    ck: CheckpointConfig
    devices: tuple[str, ...]
    model_path: str | None  # None: dummy weights
    dtype: torch.dtype
    seed: int
    max_slots: int
    max_seq_len: int
    port: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, launch: TPLaunch) -> TPGroup:
    os.environ.update(_NCCL_ENV)
    device = torch.device(launch.devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{launch.port}", rank=rank,
                            world_size=len(launch.devices))
    return TPGroup(rank, len(launch.devices))


def _build_shard(launch: TPLaunch, tp: TPGroup) -> Thinker:
    with torch.device("meta"):
        thinker = Thinker(launch.ck.thinker, tp)
    device = launch.devices[tp.rank]
    if launch.model_path is None:
        init_dummy(thinker, seed=launch.seed + tp.rank, device=device, dtype=launch.dtype)
    else:
        load_weights(thinker, read_weight_map(launch.model_path), prefix="model.", device=device, dtype=launch.dtype,
                     tp=tp, what=f"thinker rank {tp.rank}")
    return thinker.eval()


def _run(thinker: Thinker, cache: ThinkerKVCache, method: str, args: tuple, kwargs: dict):
    device = thinker.lm_head.weight.device
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    if method == "forward":
        return thinker(*args, cache=cache, **kwargs)
    return getattr(thinker, method)(*args, **kwargs)


def _worker(rank: int, launch: TPLaunch) -> None:
    tp = _init(rank, launch)
    if torch.device(launch.devices[rank]).type == "cuda":
        from ..model import moe_triton

        try:
            moe_triton.enable()  # same expert kernel as rank 0
        except RuntimeError:
            pass
    thinker = _build_shard(launch, tp)
    cache = ThinkerKVCache.allocate(launch.ck.thinker, launch.max_slots, launch.max_seq_len,
                                    device=launch.devices[rank], dtype=launch.dtype, tp=tp)
    box = [None]
    with torch.no_grad():
        while True:
            dist.broadcast_object_list(box, src=0)
            method, args, kwargs = box[0]
            if method == "stop":
                break
            _run(thinker, cache, method, args, kwargs)
    dist.destroy_process_group()


class ThinkerProxy:
    """Rank 0's view of the sharded thinker; quacks like `Thinker` for the runner."""

    def __init__(self, local: Thinker, launch: TPLaunch, procs: list):
        self.local, self.launch, self.procs = local, launch, procs
        self.cfg, self.tp = local.cfg, local.tp
        self.lm_head = local.lm_head

    def _call(self, method: str, *args, **kwargs):
        # tensors travel to the workers through the CPU (pickled); decode payloads are a few ids
        cpu_args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
        cpu_kwargs = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items() if k != "cache"}
        dist.broadcast_object_list([(method, cpu_args, cpu_kwargs)], src=0)
        return _run(self.local, kwargs.get("cache"), method, args,
                    {k: v for k, v in kwargs.items() if k != "cache"})

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self._call("embed", ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._call("logits", hidden)

    def __call__(self, inputs_embeds, position_ids, **kwargs):
        return self._call("forward", inputs_embeds, position_ids, **kwargs)

    def close(self) -> None:
        if self.procs:
            dist.broadcast_object_list([("stop", (), {})], src=0)
            for p in self.procs:
                p.join(timeout=30)
            dist.destroy_process_group()
            self.procs = []


def start_tp(ck: CheckpointConfig, devices: tuple[str, ...], model_path: str | None, dtype: torch.dtype,
             seed: int, max_slots: int, max_seq_len: int) -> ThinkerProxy:
    """Spawn ranks 1..N-1, join the process group as rank 0, build rank 0's shard."""
    launch = TPLaunch(ck, tuple(devices), model_path, dtype, seed, max_slots, max_seq_len, _free_port())
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, launch), daemon=True) for r in range(1, len(devices))]
    for p in procs:
        p.start()
    tp = _init(0, launch)
    log.info("thinker tensor-parallel over %s", ", ".join(devices))
    return ThinkerProxy(_build_shard(launch, tp), launch, procs)
