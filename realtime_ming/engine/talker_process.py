"""The process talker driver (`engine.talker.driver: process`): each talker replica steps in a process of its own.

Stepped inline the talker shares the engine's thread and process: its host work (a graph launch per stage, stop
decisions, the VAE's PCM) waits for the thinker's step and competes with the engine thread for the GIL and the CUDA
driver's locks. `ProcessTalker` runs the replica's `TalkerLoop` (`engine/talker_loop.py`) in a spawned child
(`engine/talker_child.py`) that steps it at its own pace; the engine's process only routes messages. Measured
numbers: docs/benchmarks.md.

* **Weights**: the child adopts the parent's tensors of its replica (CUDA IPC, or shared memory on CPU): nothing
  is loaded twice and every replica keeps the same weights (the parent keeps them alive while the child runs).
* **Voices**: the parent resolves a turn's voice (a preset's name, a cloned voice, or the default) to its prompt
  and sends each prompt to the child once, under a key; a prompt the parent drops is dropped by the child.
* **Messages** (typed, `talker_child.py`): engine → child over one pipe, child → engine over another. A reader
  thread in the parent hands outputs to `deliver` (PCM reaches the turns without waiting for an engine step) and
  queues the notices (`Idle`, failed turns) for the engine thread's `outputs`, in the child's order (a turn's last
  PCM before its `Idle`), waking the engine.
* **Pending**: `pending(turn_id)` is answered from the engine thread's count of the segments it sent and the
  child's last `Idle` report for the turn.
* **Lifecycle**: a child that exits (killed, out of memory, a crash) closes its pipe: the reader thread sees it at
  once and calls `die` (the engine fails every turn and reports itself dead). `close` asks the child to stop and
  kills it if it does not within the timeout. Every wait on the child is bounded: its start (`start_timeout`, the
  weights' send included: a child stuck before reading them is killed) and its graph capture (`capture_timeout`).
* **Devices**: the child gets the devices the replica's tensors are on, with their index (never a bare `cuda`,
  which the child would read as its own current device), and refuses tensors adopted from another device.
* **Diagnosis**: the child reports its start-up phases (`talker_child.Phase`); `describe()` (pid, device, alive or
  exit code, the last phase and how long ago) is part of every start and capture error and of the GPU tests' turn
  time-outs (`kill -USR1 <pid>` prints a live child's Python stacks).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections import deque
from typing import Callable

import torch
import torch.multiprocessing as torch_mp

from ..model.talker import VoicePrompt
from .config import EngineConfig
from .talker_child import (AskStats, CaptureGraphs, Captured, Died, Notices, Outputs, Phase, Progress, Ready, Spec,
                           Stats, Stop, Unvoice, Voice, Weights, backends, child_main)
from .talker_driver import Enqueue, Forget, Idle, Pause, Resume
from .talker_loop import Drop, Dropped, failed
from .talker_replica import TalkerReplica, resolved_device
from .talker_runner import TalkerOutput
from .voice_store import CustomVoice

__all__ = ["ProcessTalker", "placed_on", "warn_shared_gpus"]

log = logging.getLogger(__name__)


def placed_on(module, device: torch.device | str) -> torch.device:
    """The device `module`'s tensors are on, with its index (`device`, resolved, when it holds none): what a talker
    process is told, since a bare `cuda` would mean the child's own current device there."""
    for tensor in module.state_dict().values():
        if isinstance(tensor, torch.Tensor):
            return resolved_device(tensor.device)
    return resolved_device(device)


def warn_shared_gpus(bundle, cfg: EngineConfig) -> None:
    """Log a talker process placed on a thinker GPU: two processes share one GPU by time slices (no MPS assumed)."""
    thinker = {resolved_device(d) for d in cfg.placement.thinker_devices if torch.device(d).type == "cuda"}
    shared = sorted({str(r.device) for r in bundle.talker_replicas if r.device in thinker})
    if shared:
        log.warning("engine.talker.driver=process: talker process(es) on %s, a thinker GPU: two processes share that "
                    "GPU by time slices; on 2x H200 at N=32 no faster than the inline talker, 20 %% slower with one "
                    "on each thinker GPU (it pays on talker GPUs of its own)", ", ".join(shared))


class ProcessTalker:
    """A `TalkerDriver` over one talker replica stepped by a `TalkerLoop` in a child process. Engine-thread calls
    never wait for the child (but `capture` and `close`); `drop` and `stats` may come from any thread; `deliver`,
    `wake` and `die` are called on this object's reader thread."""

    def __init__(self, bundle, cfg: EngineConfig, replica: TalkerReplica,
                 deliver: Callable[[list[TalkerOutput]], None], wake: Callable[[], None], die: Callable[[str], None],
                 *, start_timeout: float = 600.0, capture_timeout: float = 1800.0):
        self.replica = replica
        self._bundle = bundle
        self._deliver, self._wake, self._die = deliver, wake, die
        self._sent: dict[str, int] = {}  # engine thread: enqueues sent per turn
        self._seen: dict[str, int] = {}  # engine thread: the last `Idle` seq per turn
        self._dropped = Dropped()
        self._notices: queue.SimpleQueue = queue.SimpleQueue()  # reader thread -> engine thread (`outputs`)
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
        self._stats: tuple[threading.Event, list] | None = None  # an asked `stats`: its answer's box
        self._phase: tuple[str, float, float] | None = None  # the child's last `Phase`: (name, its time, heard at)
        self.capture_timeout = capture_timeout
        self.device = placed_on(replica.talker, replica.device)
        self.vae_device = placed_on(replica.vae, replica.vae_device)
        ctx = torch_mp.get_context("spawn")
        ops_r, ops_w = ctx.Pipe(duplex=False)
        out_r, out_w = ctx.Pipe(duplex=False)
        spec = Spec(replica.index, cfg, bundle.cfg, bundle.dtype, str(self.device), str(self.vae_device),
                    bundle.talker_tokenizer, bundle.talker_special, logging.getLogger().getEffectiveLevel(),
                    backends(), bundle.hooks)
        self._proc = ctx.Process(target=child_main, args=(spec, ops_r, out_w), daemon=True,
                                 name=f"realtime-ming-talker-{replica.index}")
        self._proc.start()
        ops_r.close()
        out_w.close()
        self._ops, self._out = ops_w, out_r
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"realtime-ming-talker-{replica.index}-reader")
        self._reader.start()
        # the weights go as the first message, not as the child's arguments: its `Process` object would hold those
        # until it exits, and a child ending through `exit_now` would never hand its CUDA IPC references back (the
        # parent's blocks stay allocated after `close`, "Producer process has been terminated before all shared
        # CUDA tensors released" at its exit). They are sent from a thread of their own: a message larger than the
        # pipe's buffer waits for the child to read it, and a child stuck before its first read would otherwise
        # hold this call past `start_timeout`.
        sender = threading.Thread(target=self._send, args=(Weights((replica.talker.state_dict(),  # shared, not copied
                                                                    replica.vae.state_dict())),),
                                  daemon=True, name=f"realtime-ming-talker-{replica.index}-weights")
        sender.start()
        if not self._ready.wait(start_timeout) or self._start_error is not None:
            answered = self._ready.is_set()
            if not answered:  # stuck: killed, so a weights' send it never read fails and lets go of the pipe
                self._proc.kill()
            sender.join(5.0)
            self.close(timeout=5.0)
            raise RuntimeError(f"talker process {replica.index} did not start: "
                               f"{self._start_error if answered else f'no answer in {start_timeout:.0f} s'} "
                               f"({self.describe()})")

    # ---- engine thread ---------------------------------------------------------------------------
    def enqueue(self, op: Enqueue) -> None:
        key = self._voice_key(op.voice or self._bundle.default_voice)
        self._sent[op.turn_id] = self._sent.get(op.turn_id, 0) + 1
        self._send(Enqueue(op.turn_id, op.segment_id, op.text, key, op.seed, op.caption))

    def pause(self, turn_id: str) -> None:
        self._send(Pause(turn_id))

    def resume(self, turn_id: str) -> None:
        self._send(Resume(turn_id))

    def forget(self, turn_id: str) -> None:
        self._sent.pop(turn_id, None)
        self._seen.pop(turn_id, None)
        self._dropped.discard(turn_id)
        self._send(Forget(turn_id))

    def pending(self, turn_id: str) -> bool:
        return self._sent.get(turn_id, 0) != self._seen.get(turn_id, 0)

    def has_work(self) -> bool:
        """The engine thread never steps this talker: its work keeps no engine step going."""
        return False

    def launch(self) -> None:
        """Nothing to queue: the child steps at its own pace."""

    def outputs(self) -> list[TalkerOutput]:
        """The child's notices since the last call: `Idle` reports are recorded (a forgotten turn's is ignored),
        failed turns returned."""
        errors = []
        while True:
            try:
                events = self._notices.get_nowait()
            except queue.Empty:
                return errors
            for event in events:
                if not isinstance(event, Idle):
                    errors.append(event)
                elif event.turn_id in self._sent:
                    self._seen[event.turn_id] = max(self._seen.get(event.turn_id, 0), event.seq)

    def num_streams(self) -> int:
        return self._streams

    def capture(self, progress=None) -> None:
        """The child captures its graphs; waits, and raises what the capture raised (or the child's death)."""
        self._progress, self._capture_error = progress, None
        self._captured.clear()
        self._send(CaptureGraphs())
        deadline = time.monotonic() + self.capture_timeout
        while not self._captured.wait(0.5):
            if not self._proc.is_alive():
                raise RuntimeError(f"talker process {self.replica.index} exited during capture ({self.describe()})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"talker process {self.replica.index}: no graph capture in "
                                   f"{self.capture_timeout:.0f} s ({self.describe()})")
        self._progress = None
        if self._capture_error is not None:
            raise RuntimeError(f"talker process {self.replica.index}: {self._capture_error}")

    # ---- any thread ------------------------------------------------------------------------------
    def drop(self, turn_id: str) -> None:
        self._dropped.add(turn_id)
        self._send(Drop(turn_id))

    def stats(self, timeout: float = 5.0) -> dict | None:
        """The child's `TalkerLoop.stats` (waits up to `timeout`, None when no answer came)."""
        with self._stats_lock:
            answered, box = threading.Event(), []
            self._stats = (answered, box)
            self._send(AskStats())
            answered.wait(timeout)
            self._stats = None
            return box[0] if box else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def describe(self) -> str:
        """One line for errors and hang reports: the child's pid, device, alive or exit code, its last start-up
        phase (`talker_child.Phase`) and how long ago it was reported, its live streams."""
        proc = self._proc
        state = "alive" if proc.is_alive() else f"exit code {proc.exitcode}"
        phase = self._phase
        last = "no phase reported" if phase is None else \
            f"last phase {phase[0]!r} at {phase[1]:.1f} s, {time.monotonic() - phase[2]:.1f} s ago"
        return f"pid {proc.pid} on {self.device}, {state}, {last}, {self._streams} streams"

    def close(self, timeout: float = 10.0) -> None:
        self._closing = True
        self._send(Stop())
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
            self._send(Voice(key, VoicePrompt(cpu(prompt.spk_embed), cpu(prompt.prompt_lat), cpu(prompt.prompt_emb)),
                             prompt_text))
            gone = self._gone  # the callback (any thread, the GC) only queues the key: it must not send
            self._voice_keys[id(prompt)] = (weakref.ref(prompt, lambda _ref, k=(id(prompt), key): gone.append(k)), key)
            return key

    def _send(self, op) -> None:
        """Queue `op` for the child. A child that is gone takes nothing: its death reaches the engine through the
        reader thread, so a caller (a cancel on any thread, the engine thread) never fails on a broken pipe."""
        with self._send_lock:
            try:
                while self._gone:
                    ident, key = self._gone.popleft()
                    kept = self._voice_keys.get(ident)
                    if kept is not None and kept[1] == key:
                        del self._voice_keys[ident]
                    self._ops.send(Unvoice(key))
                self._ops.send(op)
            except (OSError, ValueError) as exc:  # broken pipe / closed handle: the child exited or was closed
                log.debug("talker process %d: %s not sent (%s)", self.replica.index, type(op).__name__, exc)

    # ---- reader thread ---------------------------------------------------------------------------
    def _notify(self, events: list) -> None:
        self._notices.put(events)
        self._wake()

    def _read(self) -> None:
        while True:
            try:
                msg = self._out.recv()
            except (EOFError, OSError):
                break
            match msg:
                case Outputs(outputs=outputs, streams=streams):
                    self._streams = streams
                    outputs = self._dropped.taken(outputs)
                    if outputs:
                        try:
                            self._deliver(outputs)
                        except Exception as exc:  # the engine could not take them: their turns fail, not the talker
                            log.exception("delivering talker outputs failed")
                            self._notify([failed(t, f"talker output: {type(exc).__name__}: {exc}")
                                          for t in sorted({o.turn_id for o in outputs})])
                case Notices(events=events):
                    self._notify(events)
                case Progress(args=args):
                    if self._progress is not None:
                        self._progress(*args)
                case Stats(stats=stats):
                    asked = self._stats
                    if asked is not None:
                        asked[1].append(stats)
                        asked[0].set()
                case Captured(error=error):
                    self._capture_error = error
                    self._captured.set()
                case Ready(error=error):
                    self._start_error = error
                    self._ready.set()
                case Phase(name=name, at=at):
                    self._phase = (name, at, time.monotonic())
                    log.debug("talker process %d: %s (%.2f s after its start)", self.replica.index, name, at)
                case Died(reason=reason):  # the child's loop is gone: a capture waiting for it never ends
                    self._capture_error = self._capture_error or reason
                    self._captured.set()
                    self._die(reason)
        self._out.close()
        if not self._closing:
            self._proc.join(1.0)
            reason = f"talker process {self.replica.index} exited (exit code {self._proc.exitcode})"
            log.critical(reason)
            if not self._ready.is_set():
                self._start_error = reason
                self._ready.set()
            self._die(reason)
