"""The talker in a process of its own (`engine.talker.own_process`): each replica's `TalkerLoop` in a child process.

On its own thread (`engine/talker_loop.py`) the talker still shares the engine's process: its host work (a graph
launch per stage, stop decisions, the VAE's PCM) competes with the engine thread and the other replicas' threads
for the GIL and for the CUDA driver's locks (4x H200, N=32: a 12-37 µs graph launch took 1.5 ms on average inside
the engine's process). `TalkerProcess` runs the same loop in a spawned child: the child steps the replica at its
own pace and the parent only routes messages.

* **Weights**: the child adopts the parent's tensors of its replica (CUDA IPC, or shared memory on CPU): nothing
  is loaded twice and every replica keeps the same weights (the parent keeps them alive while the child runs).
* **Voices**: the parent resolves a turn's voice (a preset's name, a cloned voice, or the default) to its prompt
  and sends each prompt to the child once, under a key; a prompt the parent drops is dropped by the child.
* **Messages**: engine → child over one pipe (`enqueue`, `pause`, `resume`, `forget`, `drop`, `capture`, `stats`,
  `stop`), child → engine over another (each step's outputs with the child's stream count, `Idle` and
  `TalkerFailed` notices, capture progress and result, the loop's running totals). A reader thread in the parent hands outputs to
  `deliver` and notices to `notify` in the child's order (a turn's last PCM before its `Idle`).
* **Lifecycle**: a child that exits (killed, out of memory, a crash) closes its pipe: the reader thread sees it at
  once and calls `die` (the engine fails every turn and reports itself dead). `close` asks the child to stop and
  kills it if it does not within the timeout.

The parent-side object has `TalkerLoop`'s interface: the engine and `TalkerPool` cannot tell them apart.
"""

from __future__ import annotations

import gc
import logging
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.multiprocessing as torch_mp
from tokenizers import Tokenizer

from .._exit import exit_now
from ..model.config import CheckpointConfig
from ..model.talker import TalkerSpecialIds, VoicePrompt
from .config import EngineConfig
from .talker_loop import TalkerFailed, TalkerHandle
from .talker_replica import TalkerReplica, resolved_device
from .voice_store import CustomVoice

__all__ = ["TalkerProcess", "warn_shared_gpus"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Spec:
    """What the child needs to rebuild its replica and runner (the tensors follow as the first message)."""

    index: int
    engine: EngineConfig
    checkpoint: CheckpointConfig
    dtype: torch.dtype
    device: str
    vae_device: str
    tokenizer: Tokenizer
    special: TalkerSpecialIds
    log_level: int
    backends: dict  # the parent's matmul/conv precision switches (`_backends`): the child computes as it would


@dataclass
class _ChildBundle:
    """The part of `ModelBundle` a `TalkerRunner` reads (voices come with each job, already on the device)."""

    cfg: CheckpointConfig
    dtype: torch.dtype
    talker_tokenizer: Tokenizer
    talker_special: TalkerSpecialIds
    voices: dict = field(default_factory=dict)
    default_voice: str = ""


def warn_shared_gpus(bundle, cfg: EngineConfig) -> None:
    """Log a talker process placed on a thinker GPU: two processes share one GPU by time slices (no MPS assumed)."""
    thinker = {resolved_device(d) for d in cfg.placement.thinker_devices if torch.device(d).type == "cuda"}
    shared = sorted({str(r.device) for r in bundle.talker_replicas if r.device in thinker})
    if shared:
        log.warning("engine.talker.own_process: talker process(es) on %s, a thinker GPU: two processes share that GPU "
                    "by time slices; on 2x H200 at N=32 no faster than the talker on the engine thread, 20 %% slower "
                    "with one on each thinker GPU (it pays on talker GPUs of its own)", ", ".join(shared))


class TalkerProcess(TalkerHandle):
    """One talker replica stepped by a `TalkerLoop` in a child process. Engine-thread calls never wait for the
    child (but `capture` and `close`); `drop` may come from any thread; `deliver`, `notify` and `die` are called on
    this object's reader thread."""

    def __init__(self, bundle, cfg: EngineConfig, replica: TalkerReplica,
                 deliver: Callable[[list], None], notify: Callable[[list], None], die: Callable[[str], None],
                 *, start_timeout: float = 600.0):
        super().__init__()
        self.replica = replica
        self._bundle = bundle
        self._deliver, self._notify, self._die = deliver, notify, die
        self._send_lock = threading.RLock()
        self._voice_keys: dict[int, tuple[weakref.ref, int]] = {}  # id(prompt) -> (its weakref, key in the child)
        self._gone: deque[tuple[int, int]] = deque()  # (id, key) of prompts dropped, told to the child at the next send
        self._next_key = 0
        self._streams = 0  # the child's live streams at its last report
        self._closing = False
        self._progress = None
        self._captured = threading.Event()
        self._capture_error: str | None = None
        self._ready = threading.Event()
        self._start_error: str | None = None
        self._stats_lock = threading.Lock()
        self._stats: tuple[threading.Event, list] | None = None  # an asked `loop_stats`: its answer's box
        ctx = torch_mp.get_context("spawn")
        ops_r, ops_w = ctx.Pipe(duplex=False)
        out_r, out_w = ctx.Pipe(duplex=False)
        spec = _Spec(replica.index, cfg, bundle.cfg, bundle.dtype, str(replica.device), str(replica.vae_device),
                     bundle.talker_tokenizer, bundle.talker_special, logging.getLogger().getEffectiveLevel(),
                     _backends())
        self._proc = ctx.Process(target=_child_main, args=(spec, ops_r, out_w), daemon=True,
                                 name=f"realtime-ming-talker-{replica.index}")
        self._proc.start()
        ops_r.close()
        out_w.close()
        self._ops, self._out = ops_w, out_r
        # the weights go as the first message, not as the child's arguments: its `Process` object would hold those
        # until it exits, and a child ending through `exit_now` would never hand its CUDA IPC references back (the
        # parent's blocks stay allocated after `close`, "Producer process has been terminated before all shared
        # CUDA tensors released" at its exit)
        self._send(("weights", (replica.talker.state_dict(), replica.vae.state_dict())))  # shared, not copied
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"realtime-ming-talker-{replica.index}-reader")
        self._reader.start()
        if not self._ready.wait(start_timeout) or self._start_error is not None:
            self.close(timeout=5.0)
            raise RuntimeError(f"talker process {replica.index} did not start: "
                               f"{self._start_error or f'no answer in {start_timeout:.0f} s'}")

    # ---- engine thread ---------------------------------------------------------------------------
    def enqueue(self, turn_id: str, segment_id: int, text: str, voice, *, seed=None, caption=None) -> None:
        key = self._voice_key(voice or self._bundle.default_voice)
        self._count_enqueue(turn_id)
        self._send(("enqueue", turn_id, segment_id, text, key, seed, caption))

    def drop(self, turn_id: str) -> None:
        super().drop(turn_id)
        self._send(("drop", turn_id))

    def pause(self, turn_id: str) -> None:
        self._send(("pause", turn_id))

    def resume(self, turn_id: str) -> None:
        self._send(("resume", turn_id))

    def forget(self, turn_id: str) -> None:
        self._forget_counts(turn_id)
        self._undrop(turn_id)
        self._send(("forget", turn_id))

    def num_streams(self) -> int:
        return self._streams

    def loop_stats(self, timeout: float = 5.0) -> dict | None:
        """The child's `TalkerLoop.loop_stats` (any thread; waits up to `timeout`, None when no answer came)."""
        with self._stats_lock:
            answered, box = threading.Event(), []
            self._stats = (answered, box)
            self._send(("stats",))
            answered.wait(timeout)
            self._stats = None
            return box[0] if box else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def capture(self, progress=None) -> None:
        """The child captures its graphs; waits, and raises what the capture raised (or the child's death)."""
        self._progress, self._capture_error = progress, None
        self._captured.clear()
        self._send(("capture",))
        while not self._captured.wait(0.5):
            if not self._proc.is_alive():
                raise RuntimeError(f"talker process {self.replica.index} exited during capture "
                                   f"(exit code {self._proc.exitcode})")
        self._progress = None
        if self._capture_error is not None:
            raise RuntimeError(f"talker process {self.replica.index}: {self._capture_error}")

    def close(self, timeout: float = 10.0) -> None:
        self._closing = True
        self._send(("stop",))
        self._proc.join(timeout)
        if self._proc.is_alive():
            log.error("talker process %d did not stop in %.0f s: killed", self.replica.index, timeout)
            self._proc.kill()
            self._proc.join(5.0)
        self._reader.join(5.0)
        self._ops.close()

    def _voice_key(self, voice) -> int:
        """The child's key of `voice`'s prompt, sent to the child at its first use."""
        if isinstance(voice, CustomVoice):
            prompt, prompt_text = voice.prompt, voice.prompt_text
        else:
            prompt, prompt_text = self._bundle.voices[voice]
        with self._send_lock:  # `drop` may send (and prune the keys) from another thread
            kept = self._voice_keys.get(id(prompt))
            if kept is not None and kept[0]() is prompt:
                return kept[1]
            key, self._next_key = self._next_key, self._next_key + 1
            cpu = lambda t: None if t is None else t.detach().to("cpu")  # noqa: E731
            self._send(("voice", key, VoicePrompt(cpu(prompt.spk_embed), cpu(prompt.prompt_lat),
                                                  cpu(prompt.prompt_emb)), prompt_text))
            gone = self._gone  # the callback (any thread, the GC) only queues the key: it must not send
            self._voice_keys[id(prompt)] = (weakref.ref(prompt, lambda _ref, k=(id(prompt), key): gone.append(k)), key)
            return key

    def _send(self, op: tuple) -> None:
        """Queue `op` for the child. A child that is gone takes nothing: its death reaches the engine through the
        reader thread, so a caller (a cancel on any thread, the engine thread) never fails on a broken pipe."""
        with self._send_lock:
            try:
                while self._gone:
                    ident, key = self._gone.popleft()
                    kept = self._voice_keys.get(ident)
                    if kept is not None and kept[1] == key:
                        del self._voice_keys[ident]
                    self._ops.send(("unvoice", key))
                self._ops.send(op)
            except (OSError, ValueError) as exc:  # broken pipe / closed handle: the child exited or was closed
                log.debug("talker process %d: %r not sent (%s)", self.replica.index, op[0], exc)

    # ---- reader thread ---------------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                msg = self._out.recv()
            except (EOFError, OSError):
                break
            kind = msg[0]
            if kind == "out":
                _, outputs, self._streams = msg
                outputs = self._taken(outputs)
                if outputs:
                    try:
                        self._deliver(outputs)
                    except Exception as exc:  # the engine could not take them: their turns fail, not the talker
                        log.exception("delivering talker outputs failed")
                        self._notify([TalkerFailed(t, f"talker output: {type(exc).__name__}: {exc}")
                                      for t in sorted({o.turn_id for o in outputs})])
            elif kind == "notify":
                self._notify(msg[1])
            elif kind == "progress":
                if self._progress is not None:
                    self._progress(*msg[1:])
            elif kind == "stats":
                asked = self._stats
                if asked is not None:
                    asked[1].append(msg[1])
                    asked[0].set()
            elif kind == "captured":
                self._capture_error = msg[1]
                self._captured.set()
            elif kind == "ready":
                self._start_error = msg[1]
                self._ready.set()
            elif kind == "die":
                self._die(msg[1])
        self._out.close()
        if not self._closing:
            self._proc.join(1.0)
            reason = f"talker process {self.replica.index} exited (exit code {self._proc.exitcode})"
            log.critical(reason)
            if not self._ready.is_set():
                self._start_error = reason
                self._ready.set()
            self._die(reason)


# ---- the child process -----------------------------------------------------------------------------------
def _child_main(spec: _Spec, ops, out) -> None:
    logging.basicConfig(level=spec.log_level, format=f"%(asctime)s talker-{spec.index} %(levelname)s %(name)s: "
                                                     "%(message)s")
    lock = threading.Lock()

    def send(msg: tuple) -> None:
        with lock:
            out.send(msg)

    try:
        first = ops.recv()  # ("weights", (talker state, VAE state)): this frame holds the only reference
        loop, runner = _child_loop(spec, first[1], send)
    except BaseException as exc:  # noqa: B036 - reported to the parent, which refuses to start
        log.exception("talker process %d could not start", spec.index)
        send(("ready", f"{type(exc).__name__}: {exc}"))
        return
    del first
    send(("ready", None))
    voices: dict[int, CustomVoice] = {}
    device = torch.device(spec.device)
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    try:
        while True:
            try:
                op = ops.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            kind = op[0]
            if kind == "enqueue":
                _, turn_id, segment_id, text, key, seed, caption = op
                loop.enqueue(turn_id, segment_id, text, voices[key], seed=seed, caption=caption)
            elif kind == "voice":
                _, key, prompt, prompt_text = op
                prompt = VoicePrompt(move(prompt.spk_embed), move(prompt.prompt_lat), move(prompt.prompt_emb))
                voices[key] = CustomVoice(f"talker-{key}", "", "", prompt, prompt_text, 0.0, 0)
            elif kind == "unvoice":
                voices.pop(op[1], None)
            elif kind in ("pause", "resume", "forget", "drop"):
                getattr(loop, kind)(op[1])
            elif kind == "stats":
                send(("stats", loop.loop_stats()))
            elif kind == "capture":
                try:
                    loop.capture(lambda *args: send(("progress", *args)))
                    send(("captured", None))
                except Exception as exc:  # reported to the capturing caller
                    send(("captured", f"{type(exc).__name__}: {exc}"))
            elif kind == "stop":
                break
    finally:
        loop.close()
        out.close()
        # the adopted tensors are released before the process exits, so the parent's CUDA IPC count falls to zero
        del loop, runner, voices
        gc.collect()
    exit_now(0)  # stopped cleanly: its exit code says so (finalization could still abort it, see `exit_now`)


_BACKENDS = (("matmul", "allow_tf32"), ("matmul", "allow_fp16_reduced_precision_reduction"),
             ("matmul", "allow_bf16_reduced_precision_reduction"), ("cudnn", "allow_tf32"))


def _backend(kind: str):
    return torch.backends.cuda.matmul if kind == "matmul" else torch.backends.cudnn


def _backends() -> dict:
    return {(kind, name): getattr(_backend(kind), name) for kind, name in _BACKENDS}


def _child_loop(spec: _Spec, tensors: tuple, send):
    from .models import adopt_replica
    from .talker_loop import TalkerLoop
    from .talker_runner import TalkerRunner

    for (kind, name), value in spec.backends.items():
        setattr(_backend(kind), name, value)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    replica = adopt_replica(spec.checkpoint, spec.index, *tensors, device=device,
                            vae_device=torch.device(spec.vae_device), dtype=spec.dtype)
    bundle = _ChildBundle(spec.checkpoint, spec.dtype, spec.tokenizer, spec.special)
    runner = TalkerRunner(bundle, spec.engine, replica)
    reported = [0]

    def deliver(outputs: list) -> None:
        streams = runner.num_streams()
        if outputs or streams != reported[0]:
            reported[0] = streams
            send(("out", outputs, streams))

    loop = TalkerLoop(runner, deliver, lambda events: send(("notify", events)), lambda reason: send(("die", reason)),
                      steps=spec.engine.talker.thread_steps, pipeline=spec.engine.talker.thread_pipeline)
    return loop, runner
