"""What the thinker tensor-parallel tests share: ranks spawned into one process group (`spawn_ranks`), and one
greedy decode through the KV cache (the result the ranks and the single-process reference are compared on)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from realtime_ming._exit import exit_now
from realtime_ming.model.rope3d import text_position_ids
from realtime_ming.model.thinker import ThinkerKVCache


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(fn: Callable[..., None], world: int, *args, backend: str = "gloo") -> None:
    """Run `fn(rank, *args)` in `world` spawned processes joined in one process group (nccl: rank r on cuda:r).

    A rank whose `fn` raised fails the spawn with its traceback. One that returned leaves the group and ends
    through `exit_now(0)`: interpreter finalization after gloo now and then aborts a finished rank with SIGABRT
    (torch's teardown of threads still joinable, seen in CI), which would fail a test whose ranks all agreed.
    """
    mp.spawn(_rank_main, args=(fn, world, free_port(), backend, args), nprocs=world, join=True)


def _rank_main(rank: int, fn: Callable[..., None], world: int, port: int, backend: str, args: tuple) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        fn(rank, *args)
        dist.barrier()  # no rank leaves while a peer is still inside a collective
    finally:
        dist.destroy_process_group()
    exit_now(0)


def greedy_decode(thinker, ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-prompt logits [1, T, V] and `new_tokens` greedy ids decoded through the KV cache."""
    t = ids.shape[1]
    pos = torch.arange(t)[None]
    cache = ThinkerKVCache.allocate(thinker.cfg, 1, t + new_tokens, tp=thinker.tp)
    slots, zero = torch.tensor([0]), torch.zeros(1, dtype=torch.int64)
    with torch.no_grad():
        logits = thinker.logits(thinker(thinker.embed(ids), pos.expand(3, 1, t), cache=cache, slots=slots,
                                        cache_positions=pos))
        token, out = logits[:, -1].argmax(-1), []
        for step in range(new_tokens):
            out.append(token)
            cp = torch.tensor([[t + step]])
            h = thinker(thinker.embed(token[:, None]), text_position_ids(cp, zero), cache=cache, slots=slots,
                        cache_positions=cp)
            token = thinker.logits(h[:, -1]).argmax(-1)
    return logits, torch.stack(out, dim=1)
