"""Tensor-parallel thinker: rank 0 lives in the engine, ranks 1..N-1 are worker processes.

Every thinker call on rank 0 (`embed`, the stack's `forward`, `logits`, the decoder's `step` and
`capture`) is first published to the workers as one fixed-size int64 header broadcast plus one
broadcast per tensor argument (`engine/tp_wire.py`: no pickling, one small H2D copy), then run locally, so all ranks enter the same NCCL collectives in the same order
(nano-vllm's `call`). Only rank 0 samples. Each rank owns its own KV-cache shard and decoder
(`ThinkerDecoder`, CUDA graphs captured on every rank together); the proxy swaps the caller's
cache for the local one.

Liveness: the engine watches the worker processes (`procs`, their sentinels, in a thread of its own:
`engine/supervision.py` WorkerWatch), so a rank that dies fails the engine at once instead of leaving
rank 0 waiting in a collective; `close` then `abort`s (kills the survivors, no collective).

Shutdown (`close`) is bounded: rank 0 publishes `stop`; every rank releases its CUDA graphs (a graph
that captured a NCCL collective pins the communicator, and NCCL's destroy waits for such graphs
forever -- the hang seen on 2 GPUs, pytorch#115388) and leaves the process group, rank 0 in a
helper thread with a deadline; a worker exits 0 once it has left (its acknowledgement). Workers not
gone by the deadline are terminated, then killed. A worker whose rank 0 process dies exits within a second.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .._exit import exit_now
from ..model.config import CheckpointConfig
from ..model.kernels import TRITON, Kernels
from ..model.kernels.all_reduce import OneShotAllReduce
from ..model.layers import TPGroup
from ..model.loader import init_dummy, load_weights, read_weight_map
from ..model.thinker import Thinker, ThinkerKVCache
from .kv_slots import copy_kv_prefix
from .thinker_decode import ThinkerDecoder
from .thinker_mixed import ThinkerMixer
from .thinker_prefill import ThinkerPrefiller
from .tp_wire import Publisher, Receiver

__all__ = ["CLOSE_TIMEOUT_S", "EXIT_LEAVE_STUCK", "EXIT_PARENT_GONE", "TPLaunch", "ThinkerProxy", "start_tp"]

log = logging.getLogger(__name__)

# NVLink multicast stays off on shared hosts (device README); set before NCCL initialises
_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CLOSE_TIMEOUT_S = 20.0  # the whole of a clean `close`: stop, release, leave the group, workers gone
EXIT_LEAVE_STUCK = 3  # a worker's exit code when it could not leave the process group in time
EXIT_PARENT_GONE = 4  # a worker's exit code when rank 0's process died under it


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
    kernels: Kernels = TRITON  # every rank builds its shard with rank 0's kernel selection
    all_reduce: str = "nccl"  # engine.thinker.all_reduce: "one_shot" builds the symmetric-memory path on every rank
    expert_dtype: str = "model"  # engine.expert_dtype: "fp8" quantises every rank's routed experts while loading


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
    one_shot = None
    if launch.all_reduce == "one_shot":
        if device.type != "cuda":
            raise ValueError("engine.thinker.all_reduce=one_shot needs CUDA thinker devices")
        one_shot = OneShotAllReduce(device, launch.dtype)  # collective: every rank builds it here
    return TPGroup(rank, len(launch.devices), one_shot=one_shot)


def _build_shard(launch: TPLaunch, tp: TPGroup) -> Thinker:
    with torch.device("meta"):
        thinker = Thinker(launch.ck.thinker, tp, kernels=launch.kernels, expert_dtype=launch.expert_dtype)
    device = launch.devices[tp.rank]
    if launch.model_path is None:
        init_dummy(thinker, seed=launch.seed + tp.rank, device=device, dtype=launch.dtype)
    else:
        load_weights(thinker, read_weight_map(launch.model_path), prefix="model.", device=device, dtype=launch.dtype,
                     tp=tp, what=f"thinker rank {tp.rank}")
    return thinker.eval()


def _spawn(fn: Callable[[], None], name: str) -> threading.Thread:
    """Run `fn` in a daemon thread (a shutdown step that may block in a collective); a failure is logged."""

    def run():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - logged; the caller goes on with its shutdown
            log.warning("%s failed: %s: %s", name, type(exc).__name__, exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def _bounded(fn: Callable[[], None], timeout_s: float, name: str) -> bool:
    """Run `fn` in a daemon thread; True when it finished (returned or raised) within `timeout_s`."""
    thread = _spawn(fn, name)
    thread.join(timeout_s)
    return not thread.is_alive()


def _leave_group(device: torch.device, *, abort: bool = False) -> None:
    """Leave the default process group: destroy (flushes pending collectives), or abort (NCCL: no flush, for
    a group whose peers are dead or stuck). Callers release their CUDA graphs first and bound this."""
    if not dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)  # a helper thread's current device is cuda:0
    aborter = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort and aborter is not None and dist.get_backend() == "nccl":
        aborter()
    else:
        dist.destroy_process_group()


def _release(steps) -> None:
    """Free the CUDA graphs of the graphed step objects (decoder, prefiller) before the group is left."""
    for step in steps:
        if step is not None:
            step.release()


def _run(thinker: Thinker, cache: ThinkerKVCache, method: str, args: tuple, kwargs: dict):
    if method == "forward":
        return thinker(*args, cache=cache, **kwargs)
    return getattr(thinker, method)(*args, **kwargs)


def _exit_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """Worker: exit at once when rank 0's process (pid `parent`) is gone (killed, crashed), instead of waiting
    in the rendezvous or a collective forever and holding its GPU. A daemon thread watches the parent pid (no
    signal set-up that the exit of the thread that spawned us could trigger)."""

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(EXIT_PARENT_GONE)

    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()


def _worker(rank: int, launch: TPLaunch, parent: int) -> None:
    _exit_with_parent(parent)
    tp = _init(rank, launch)
    thinker = _build_shard(launch, tp)
    device = torch.device(launch.devices[rank])
    cache = ThinkerKVCache.allocate(launch.ck.thinker, launch.max_slots, launch.max_seq_len,
                                    device=device, dtype=launch.dtype, tp=tp)
    decoder = prefiller = mixer = None
    inbox = Receiver(device)
    with torch.no_grad():
        while (call := inbox.receive()).method != "stop":
            match call:
                case ("decoder_init", args, kwargs):
                    decoder = ThinkerDecoder(thinker, cache, *args, device=device, **kwargs)
                case ("decoder_capture", _, _):
                    decoder.capture()
                case ("decoder_step", args, _):
                    decoder.step(*args)
                case ("prefiller_init", args, kwargs):
                    prefiller = ThinkerPrefiller(thinker, cache, *args, dtype=launch.dtype, device=device, **kwargs)
                case ("prefiller_capture", _, _):
                    prefiller.capture()
                case ("prefiller_step", _, kwargs):
                    prefiller.step(**kwargs)
                case ("mixer_init", args, kwargs):
                    mixer = ThinkerMixer(thinker, cache, *args, dtype=launch.dtype, device=device, **kwargs)
                case ("mixer_capture", _, _):
                    mixer.capture()
                case ("mixer_step", args, kwargs):
                    mixer.step(*args, **kwargs)
                case ("kv_copy", args, _):
                    copy_kv_prefix(cache, *args)
                case (method, args, kwargs):
                    _run(thinker, cache, method, args, kwargs)
    _release((decoder, prefiller, mixer))
    del decoder, prefiller, mixer
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if not _bounded(lambda: _leave_group(device), CLOSE_TIMEOUT_S / 2, f"tp-rank-{rank}-leave"):
        log.error("tp rank %d could not leave the process group within %.0f s", rank, CLOSE_TIMEOUT_S / 2)
        os._exit(EXIT_LEAVE_STUCK)  # the stuck teardown thread would also block a normal interpreter exit
    exit_now(0)  # its acknowledgement: finalization could still abort it (torch's teardown, seen once in CI)


class ThinkerProxy:
    """Rank 0's view of the sharded thinker; quacks like `Thinker` for the runner."""

    def __init__(self, local: Thinker, launch: TPLaunch, procs: list):
        self.local, self.launch, self.procs = local, launch, procs
        self.cfg, self.tp = local.cfg, local.tp
        self.lm_head = local.lm_head
        self._steps: list = []  # rank 0's graphed step objects (decoders, prefillers): released before leaving
        self._pub = Publisher(self.device)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def _call(self, method: str, *args, **kwargs):
        cache = kwargs.pop("cache", None)
        self._pub.publish(method, args, kwargs)
        return _run(self.local, cache, method, args, kwargs)

    def decoder(self, cache: ThinkerKVCache, batch_buckets, kv_buckets, *, enforce_eager: bool = False) -> "_ProxyDecoder":
        """A `ThinkerDecoder` on every rank (each over its own cache shard); calls go to all of them."""
        args = (tuple(batch_buckets), tuple(kv_buckets))
        self._pub.publish("decoder_init", args, {"enforce_eager": enforce_eager})
        local = ThinkerDecoder(self.local, cache, *args, device=self.device, enforce_eager=enforce_eager)
        self._steps.append(local)
        return _ProxyDecoder(local, self._pub)

    def prefiller(self, cache: ThinkerKVCache, widths, *, rows=(1,), tokens: int | None = None) -> "_ProxyPrefiller":
        """A `ThinkerPrefiller` on every rank (each over its own cache shard); calls go to all of them."""
        shape = {"rows": tuple(rows), "tokens": tokens}
        self._pub.publish("prefiller_init", (tuple(widths),), shape)
        local = ThinkerPrefiller(self.local, cache, tuple(widths), dtype=self.launch.dtype, device=self.device, **shape)
        self._steps.append(local)
        return _ProxyPrefiller(local, self._pub)

    def mixer(self, cache: ThinkerKVCache, token_buckets, *, picks: int, enforce_eager: bool = False) -> "_ProxyMixer":
        """A `ThinkerMixer` on every rank (each over its own cache shard); calls go to all of them."""
        kwargs = {"picks": int(picks), "enforce_eager": enforce_eager}
        self._pub.publish("mixer_init", (tuple(token_buckets),), kwargs)
        local = ThinkerMixer(self.local, cache, tuple(token_buckets), dtype=self.launch.dtype, device=self.device,
                             **kwargs)
        self._steps.append(local)
        return _ProxyMixer(local, self._pub)

    def copy_kv(self, cache: ThinkerKVCache, src: int, dst: int, length: int) -> None:
        """Copy a slot's K/V prefix into another slot on every rank (`KVSlotManager.fork`)."""
        self._pub.publish("kv_copy", (int(src), int(dst), int(length)))
        copy_kv_prefix(cache, src, dst, length)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self._call("embed", ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._call("logits", hidden)

    def __call__(self, inputs_embeds, position_ids, **kwargs):
        return self._call("forward", inputs_embeds, position_ids, **kwargs)

    def dead_workers(self) -> list[str]:
        """The workers that have exited, described (a non-blocking check: no collective, no device sync)."""
        return [f"{p.name} (pid {p.pid}, exit code {p.exitcode})" for p in self.procs if not p.is_alive()]

    def abort(self, timeout_s: float = 5.0) -> None:
        """Kill every worker without a collective (a rank died, or rank 0 is stuck in one), then abort rank 0's
        side of the group (bounded: a thread stuck in a collective may hold it). Idempotent."""
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=timeout_s)
        self.procs = []
        steps, self._steps = self._steps, []
        if dist.is_initialized() and not _bounded(lambda: (_release(steps), _leave_group(self.device, abort=True)),
                                                  timeout_s, "tp-rank-0-abort"):
            log.error("rank 0 could not abort its process group within %.0f s; it is left behind", timeout_s)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the workers and leave the process group within about `timeout_s` (+ a few seconds to kill what
        did not stop). Call it once no other thread uses the thinker. Idempotent."""
        if not self.procs:
            return
        if self.dead_workers():  # a collective would wait for the dead rank forever
            log.error("tensor-parallel workers gone (%s): killing the others", ", ".join(self.dead_workers()))
            self.abort()
            return
        procs, steps, self._steps = self.procs, self._steps, []
        deadline = time.monotonic() + timeout_s

        def shutdown():
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            self._pub.publish("stop")
            _release(steps)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            _leave_group(self.device)

        thread = _spawn(shutdown, "tp-rank-0-close")  # the workers leave theirs at the same time
        thread.join(timeout_s)
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        _end(procs)
        self.procs = []
        if thread.is_alive():  # stuck in a collective with a worker that did not stop: that peer is gone now
            thread.join(2.0)
        if dist.is_initialized():  # the clean path did not get to leave the group (stuck, or a collective failed)
            log.error("rank 0 did not leave the process group cleanly within %.0f s: aborting it", timeout_s)
            if not _bounded(lambda: _leave_group(self.device, abort=True), 5.0, "tp-rank-0-abort"):
                log.error("rank 0 could not abort its process group; it is left behind")
        stuck = [f"{p.name} (exit code {p.exitcode})" for p in procs if p.exitcode != 0]
        if stuck:
            log.error("tensor-parallel workers did not stop cleanly: %s", ", ".join(stuck))


class _ProxyGraphs:
    """Rank 0's side of a graphed step object that exists on every rank (decoder, prefiller): each
    capture/step is published first (the workers run theirs), then run locally."""

    name = ""

    def __init__(self, local, pub: Publisher):
        self.local, self.pub = local, pub

    @property
    def eager(self) -> bool:
        return self.local.eager

    @property
    def graphed(self) -> bool:
        return self.local.graphed

    def capture(self, progress=None) -> None:
        if not self.eager:
            self.pub.publish(f"{self.name}_capture")
            self.local.capture(progress)


class _ProxyDecoder(_ProxyGraphs):
    name = "decoder"

    def step(self, tokens: list[int], positions: list[int], deltas: list[int], slots: list[int]) -> torch.Tensor:
        args = (list(tokens), list(positions), list(deltas), list(slots))
        self.pub.publish("decoder_step", args)
        return self.local.step(*args)


class _ProxyPrefiller(_ProxyGraphs):
    name = "prefiller"

    def fits(self, width: int, rows: int = 1) -> bool:
        return self.local.fits(width, rows)

    def step(self, embeds, rotary, cpos, slots, image_mask, audio_mask) -> torch.Tensor:
        inputs = dict(embeds=embeds, rotary=rotary, cpos=cpos, slots=slots, image_mask=image_mask,
                      audio_mask=audio_mask)
        self.pub.publish("prefiller_step", (), inputs)  # tensors follow by broadcast
        return self.local.step(**inputs)


class _ProxyMixer(_ProxyGraphs):
    name = "mixer"

    @property
    def max_tokens(self) -> int:
        return self.local.max_tokens

    @property
    def picks(self) -> int:
        return self.local.picks

    def step(self, needed: int, ints: torch.Tensor, embeds: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
        inputs = dict(ints=ints, embeds=embeds, pick=pick)
        self.pub.publish("mixer_step", (int(needed),), inputs)  # tensors follow by broadcast
        return self.local.step(needed, **inputs)


def start_tp(ck: CheckpointConfig, devices: tuple[str, ...], model_path: str | None, dtype: torch.dtype,
             seed: int, max_slots: int, max_seq_len: int, kernels: Kernels = TRITON,
             all_reduce: str = "nccl", expert_dtype: str = "model") -> ThinkerProxy:
    """Spawn ranks 1..N-1, join the process group as rank 0, build rank 0's shard.

    If joining or rank 0's shard build fails, the workers are ended and the process group destroyed
    before the error propagates, so a later engine in this process can start its own group.
    """
    launch = TPLaunch(ck, tuple(devices), model_path, dtype, seed, max_slots, max_seq_len, _free_port(), kernels,
                      all_reduce, expert_dtype)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, launch, os.getpid()), daemon=True, name=f"tp-rank-{r}")
             for r in range(1, len(devices))]
    try:
        for p in procs:
            p.start()
        tp = _init(0, launch)
        log.info("thinker tensor-parallel over %s", ", ".join(devices))
        return ThinkerProxy(_build_shard(launch, tp), launch, procs)
    except BaseException:
        _abandon(procs)
        raise


def _end(procs: list, grace_s: float = 2.0) -> None:
    """Terminate the workers still alive, then kill those that ignore it (a stopped process, a stuck driver call)."""
    alive = [p for p in procs if p.pid is not None and p.is_alive()]
    for p in alive:
        p.terminate()
    for p in alive:
        p.join(timeout=grace_s)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


def _abandon(procs: list) -> None:
    """Failure cleanup of start_tp: end the workers (they may wait in a collective rank 0 never joins, so
    no stop message) and leave the process group."""
    _end(procs, grace_s=10.0)
    if dist.is_initialized():
        dist.destroy_process_group()
