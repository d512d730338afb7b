"""How a talker replica orders its GPU work: the talker's steps on one CUDA stream, the streaming AudioVAE (its
chunks and every write to its per-row state) on another.

A talker step's stop decisions and its VAE chunk depend on that step alone. With one stream for both, reading a
step's stop probabilities (a host copy) or running its VAE chunk waits for everything queued before on that
stream — in a pipelined talker loop (`engine/talker_loop.py`, `engine.talker.pipeline`) that is the next
launch, queued before this one is finished, so the host sat idle for a whole step and the next launch went out
only after it: no overlap at all. Here each queued step (`QueuedStep`) copies its stop probabilities to pinned
host memory and records an event right after its outputs exist; the host waits for that event only, and the VAE
stream waits for it before decoding the step's latents, while the talker stream already runs the next step.

The two streams touch disjoint state: the talker's (LM cache, history, hidden state, aggregator output) only on
the talker stream, the VAE's (`VAEStreamState`) only on the VAE stream, each in the order the runner issues it.
`finish` reads every VAE chunk back to the host before it returns, so nothing the VAE stream reads is freed or
rewritten while it is still queued there. Off CUDA both contexts do nothing and a step's stop probabilities are
read directly.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch

__all__ = ["QueuedStep", "TalkerStreams"]


@dataclass(frozen=True, slots=True)
class QueuedStep:
    """One talker step queued on the GPU: its latents [n, P, C], the streams it stepped (by row), its stop
    probabilities (on the host once `ready` is reached) and the event recorded after its outputs (None off CUDA)."""

    gen_lat: torch.Tensor
    rows: list
    stop: torch.Tensor  # [n] P(stop) per row
    ready: torch.cuda.Event | None

    @classmethod
    def queue(cls, gen_lat: torch.Tensor, stop_prob: torch.Tensor, rows: list, keep: bool) -> "QueuedStep":
        """Call right after the step's outputs were queued, on the stream that queued them. `keep`: the latents
        are copied out of graph memory first (the next replay reuses it)."""
        if keep:
            gen_lat = gen_lat.clone()
        stop = stop_prob[:, 1]
        if stop.device.type != "cuda":
            return cls(gen_lat, rows, stop.clone() if keep else stop, None)
        host = torch.empty(stop.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(stop.float(), non_blocking=True)
        ready = torch.cuda.Event()
        # after the copies above, on the stream that queued them (named by the outputs' device, not taken from the
        # thread's current device): the VAE stream may read the latents once it is reached
        ready.record(torch.cuda.current_stream(stop.device))
        return cls(gen_lat, rows, host, ready)

    def stop_probs(self) -> list[float]:
        """P(stop) per row; waits for this step's outputs only, not for work queued after it."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.stop.float().tolist()


class TalkerStreams:
    """The talker's CUDA stream on each of its devices (the talker's and the VAE's) and the VAE's own stream."""

    def __init__(self, device: torch.device, vae_device: torch.device):
        self.device, self.vae_device = device, vae_device
        cuda = {d for d in (device, vae_device) if d.type == "cuda"}
        self._talker = {d: torch.cuda.Stream(d) for d in cuda}
        self._vae = torch.cuda.Stream(vae_device) if vae_device.type == "cuda" else None

    @property
    def talker_stream(self) -> torch.cuda.Stream | None:
        """The stream the talker's steps run on (None off CUDA)."""
        return self._talker.get(self.device)

    @contextmanager
    def talker(self):
        """The talker's streams current (each of its devices), and the talker's device the current one (Triton
        launches, events recorded and tensors made without a device go to the current device: a talker beside
        another GPU's thinker needs it). Making a stream current also makes its device current
        (`torch.cuda.set_stream`), so with the VAE on another GPU the talker's device is entered last, whatever the
        order of the streams."""
        with ExitStack() as stack:
            for stream in self._talker.values():
                stack.enter_context(torch.cuda.stream(stream))
            if self.device.type == "cuda":
                stack.enter_context(torch.cuda.device(self.device))
            yield

    @contextmanager
    def vae(self, after: QueuedStep | None = None):
        """The VAE's stream current (and its device), its work queued after `after`'s outputs (if given)."""
        if self._vae is None:
            yield
            return
        if after is not None and after.ready is not None:
            self._vae.wait_event(after.ready)
        with torch.cuda.device(self.vae_device), torch.cuda.stream(self._vae):
            yield
