"""The tensor-parallel wire format (gloo, two CPU processes): every kind of argument a thinker call carries
arrives on the worker as sent, in order; an argument that cannot be encoded fails on rank 0 before anything
is broadcast."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from thinker_support import spawn_ranks

from realtime_ming.engine.tp_wire import HEADER_LEN, Publisher, Receiver

pytestmark = pytest.mark.timeout(120)


def _calls() -> list[tuple[str, tuple, dict]]:
    gen = torch.Generator().manual_seed(0)
    embeds = torch.randn(2, 5, 8, generator=gen)
    return [
        ("decoder_init", ((1, 2, 4), (256, 1024)), {"enforce_eager": False}),
        ("prefiller_init", ((16, 32),), {"rows": (1, 2), "tokens": None}),
        ("decoder_step", ([7, 8, 9], [0, 3, 5], [0, -2, 1], [2, 0, 1]), {}),
        ("forward", (embeds, torch.arange(30).view(3, 2, 5)),
         {"slots": torch.tensor([1, 0]), "cache_positions": torch.arange(10).view(2, 5), "kv_len": 64,
          "image_mask": torch.zeros(2, 5, dtype=torch.bool), "audio_mask": torch.ones(2, 5, dtype=torch.bool)}),
        ("embed", (torch.tensor([[3, 1, 4]]),), {}),
        ("logits", (embeds[:, -1].to(torch.bfloat16),), {}),
        ("decoder_capture", (), {}),
        ("kv_copy", (2, 0, 17), {}),
        ("stop", (), {}),
    ]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _rank(rank: int, out: str) -> None:
    if rank == 0:
        pub = Publisher("cpu")
        for method, args, kwargs in _calls():
            pub.publish(method, args, kwargs)
    else:
        inbox = Receiver("cpu")
        got = [tuple(inbox.receive()) for _ in _calls()]
        torch.save(got, out)


def test_calls_arrive_as_sent(tmp_path):
    spawn_ranks(_rank, 2, str(tmp_path / "got.pt"))
    got = torch.load(tmp_path / "got.pt")
    for (method, args, kwargs), (m, a, k) in zip(_calls(), got, strict=True):
        assert m == method
        assert len(a) == len(args) and all(_same(x, y) for x, y in zip(args, a)), method
        assert k.keys() == kwargs.keys() and all(_same(v, k[n]) for n, v in kwargs.items()), method


@pytest.mark.parametrize(("method", "args", "kwargs", "error"), [
    ("forward", (torch.zeros(1),), {"routing": []}, "keyword 'routing'"),
    ("forward", (torch.zeros(1),), {"kv_len": 1.5}, "of type float"),
    ("embed", (torch.zeros(1, dtype=torch.complex64),), {}, "of type Tensor"),
    ("decoder_step", (list(range(HEADER_LEN)),), {}, "exceeds"),
    ("reset_everything", (), {}, "not publishable"),
])
def test_unencodable_calls_fail_before_any_broadcast(method, args, kwargs, error):
    """No process group exists here: reaching a broadcast would raise a different error."""
    assert not dist.is_initialized()
    with pytest.raises((TypeError, ValueError), match=error):
        Publisher("cpu").publish(method, args, kwargs)
