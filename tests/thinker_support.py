"""What the thinker tensor-parallel tests share: a free loopback port for the process group, and one greedy
decode through the KV cache (the result the ranks and the single-process reference are compared on)."""

from __future__ import annotations

import socket

import torch

from realtime_ming.model.rope3d import text_position_ids
from realtime_ming.model.thinker import ThinkerKVCache


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
