"""The tensor-parallel control plane's wire format: one fixed-size int64 header per call, then its tensors.

Rank 0 publishes each thinker call as a header of `HEADER_LEN` int64s -- the method, then every argument
as (key, kind, value): None, an int, a bool, a list of ints inline, or a tensor's dtype and shape -- followed
by one `dist.broadcast` per tensor argument. No pickling, no per-call allocation of the header; on CUDA
the header is filled in pinned host memory and reaches the device with one asynchronous copy (a ring of
pinned buffers, each reused only once its previous copy has completed), so publishing a decode step costs
one small H2D copy and one broadcast, without a host sync on rank 0. Workers read the header back to the
host (they wait for rank 0 anyway), then receive the tensors it describes.

A call that cannot be encoded (an unknown method or keyword, a value of another type, a header overflow)
raises before anything is broadcast, so the ranks never disagree about what was sent.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

__all__ = ["HEADER_LEN", "METHODS", "Call", "Publisher", "Receiver"]

HEADER_LEN = 1024  # int64s: a decode step of B rows takes 4 * B + 14
METHODS = ("stop", "embed", "forward", "logits", "decoder_init", "decoder_capture", "decoder_step",
           "prefiller_init", "prefiller_capture", "prefiller_step", "kv_copy", "mixer_init", "mixer_capture",
           "mixer_step")
# keyword arguments the thinker calls take (a key code is a positional index below _POSITIONAL, else one of these)
KEYWORDS = ("slots", "cache_positions", "kv_len", "image_mask", "audio_mask", "enforce_eager", "rows", "tokens",
            "embeds", "rotary", "cpos", "ints", "pick", "picks")
_POSITIONAL = 16
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)
_NONE, _INT, _BOOL, _INTS, _TENSOR = range(5)


class Call(NamedTuple):
    """One published thinker call, as a worker receives it: `method` is one of METHODS."""

    method: str
    args: tuple
    kwargs: dict


def _encode(method: str, args: tuple, kwargs: dict) -> tuple[list[int], list[torch.Tensor]]:
    if method not in METHODS:
        raise ValueError(f"tensor-parallel call {method!r} is not publishable")
    words, tensors = [METHODS.index(method), len(args) + len(kwargs)], []
    items = [(i, v) for i, v in enumerate(args)] + [(k, v) for k, v in kwargs.items()]
    for key, v in items:
        if isinstance(key, int):
            if key >= _POSITIONAL:
                raise ValueError(f"{method}: more than {_POSITIONAL} positional arguments")
            words.append(key)
        elif key in KEYWORDS:
            words.append(_POSITIONAL + KEYWORDS.index(key))
        else:
            raise ValueError(f"{method}: keyword {key!r} is not publishable")
        if v is None:
            words.append(_NONE)
        elif isinstance(v, bool):
            words += [_BOOL, int(v)]
        elif isinstance(v, int):
            words += [_INT, v]
        elif isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            words += [_INTS, len(v), *v]
        elif isinstance(v, torch.Tensor) and v.dtype in DTYPES:
            words += [_TENSOR, DTYPES.index(v.dtype), v.dim(), *v.shape]
            tensors.append(v)
        else:
            raise TypeError(f"{method}: argument {key!r} of type {type(v).__name__} is not publishable")
    if len(words) > HEADER_LEN:
        raise ValueError(f"{method}: header of {len(words)} words exceeds {HEADER_LEN}")
    return words, tensors


class Publisher:
    """Rank 0's sender: `publish(method, args, kwargs)` broadcasts one call to every worker."""

    RING = 4

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=self.device)
        self._cuda = self.device.type == "cuda"
        if self._cuda:
            self._pinned = [torch.zeros(HEADER_LEN, dtype=torch.int64, pin_memory=True) for _ in range(self.RING)]
            self._copied = [torch.cuda.Event() for _ in range(self.RING)]  # each buffer's last copy
            self._next = 0

    def publish(self, method: str, args: tuple = (), kwargs: dict | None = None) -> None:
        words, tensors = _encode(method, tuple(args), dict(kwargs or {}))
        n = len(words)
        if self._cuda:
            i, self._next = self._next, (self._next + 1) % self.RING
            self._copied[i].synchronize()  # its copy RING calls ago (long done in practice; unrecorded: no wait)
            self._pinned[i].numpy()[:n] = words
            with torch.cuda.device(self.device):
                self._header[:n].copy_(self._pinned[i][:n], non_blocking=True)
                self._copied[i].record()
        else:
            self._header[:n] = torch.tensor(words, dtype=torch.int64)
        dist.broadcast(self._header, src=0)
        for t in tensors:
            dist.broadcast(t.to(self.device).contiguous(), src=0)


class Receiver:
    """A worker's side: `receive()` -> the next Call, its tensors materialised on `device`."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=self.device)

    def receive(self) -> Call:
        dist.broadcast(self._header, src=0)
        words = self._header.tolist()
        method, count, at = METHODS[words[0]], words[1], 2
        args: list = []
        kwargs: dict = {}
        for _ in range(count):
            key, kind = words[at], words[at + 1]
            at += 2
            if kind == _NONE:
                v = None
            elif kind in (_INT, _BOOL):
                v = words[at] if kind == _INT else bool(words[at])
                at += 1
            elif kind == _INTS:
                n = words[at]
                v, at = list(words[at + 1:at + 1 + n]), at + 1 + n
            else:
                dtype, ndim = DTYPES[words[at]], words[at + 1]
                shape, at = words[at + 2:at + 2 + ndim], at + 2 + ndim
                v = torch.empty(shape, dtype=dtype, device=self.device)
                dist.broadcast(v, src=0)  # in argument order, as rank 0 sends them
            if key < _POSITIONAL:
                args.append(v)
            else:
                kwargs[KEYWORDS[key - _POSITIONAL]] = v
        return Call(method, tuple(args), kwargs)

