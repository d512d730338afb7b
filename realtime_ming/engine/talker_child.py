"""The talker process's side (`engine.talker.driver: process`): rebuild the replica, run its loop, answer the pipe.

The child adopts the parent's tensors of its replica (`models.adopt_replica`: CUDA IPC, or shared memory on CPU),
with the parent's matmul precision switches, and runs a `TalkerLoop` over a `TalkerRunner` of it. The messages
are typed: parent → child `Weights` (first), the loop's ops (`talker_driver.Enqueue` with a voice key, `Pause`,
`Resume`, `Forget`, `talker_loop.Drop`), `Voice` / `Unvoice`, `CaptureGraphs`, `AskStats`, `Stop`; child → parent
`Ready`, `Outputs` (with the child's stream count), `Notices`, `Progress`, `Captured`, `Stats`, `Died`, `Phase`.

Diagnosis (a child that stalls is otherwise a silent wait in the engine): the child logs each start-up phase once
at INFO and reports it as a `Phase` (the parent names the last one in its errors): started, its device made current,
the weights received, adopted on the device, the runner built, its loop thread on the device, graphs capturing and
captured, the first op applied, the first step launched and finished, the first output sent. `kill -USR1 <pid>`
prints every thread's Python stack of a live child to its stderr (faulthandler) and lets it go on.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import signal
import threading
import time
from dataclasses import dataclass, field, replace

import torch
from tokenizers import Tokenizer

from .._exit import exit_now
from ..model.config import CheckpointConfig
from ..model.talker import TalkerSpecialIds, VoicePrompt
from .config import EngineConfig
from .hooks import NO_HOOKS, EngineHooks
from .talker_driver import Enqueue, Forget, Pause, Resume
from .talker_loop import Drop, TalkerLoop, enter_device
from .voice_store import CustomVoice

__all__ = ["Phase", "Spec", "child_main", "backends"]

log = logging.getLogger(__name__)


# ---- parent → child ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Weights:
    """The replica's (talker state, VAE state), shared, not copied: the first message (see `ProcessTalker`)."""

    tensors: tuple


@dataclass(frozen=True, slots=True)
class Voice:
    """A voice prompt (on the CPU) and its transcript, under `key` in later `Enqueue`s."""

    key: int
    prompt: VoicePrompt
    text: str


@dataclass(frozen=True, slots=True)
class Unvoice:
    key: int


@dataclass(frozen=True, slots=True)
class CaptureGraphs:
    pass


@dataclass(frozen=True, slots=True)
class AskStats:
    pass


@dataclass(frozen=True, slots=True)
class Stop:
    pass


# ---- child → parent ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ready:
    error: str | None  # None: started


@dataclass(frozen=True, slots=True)
class Outputs:
    outputs: list
    streams: int  # the child's live streams now


@dataclass(frozen=True, slots=True)
class Notices:
    events: list  # `Idle`s and failed `TalkerOutput`s


@dataclass(frozen=True, slots=True)
class Progress:
    args: tuple


@dataclass(frozen=True, slots=True)
class Captured:
    error: str | None


@dataclass(frozen=True, slots=True)
class Stats:
    stats: dict


@dataclass(frozen=True, slots=True)
class Died:
    reason: str


@dataclass(frozen=True, slots=True)
class Phase:
    """A start-up milestone the child reached, `at` seconds after it started (see the module's docstring)."""

    name: str
    at: float


@dataclass(frozen=True)
class Spec:
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
    backends: dict = field(default_factory=dict)  # the parent's matmul precision switches (`backends`)
    hooks: EngineHooks = NO_HOOKS  # the parent bundle's test / benchmark hooks


@dataclass
class _ChildBundle:
    """The part of `ModelBundle` a `TalkerRunner` reads (voices come with each job, already on the device)."""

    cfg: CheckpointConfig
    dtype: torch.dtype
    talker_tokenizer: Tokenizer
    talker_special: TalkerSpecialIds
    voices: dict = field(default_factory=dict)
    default_voice: str = ""
    hooks: EngineHooks = NO_HOOKS


def child_main(spec: Spec, ops, out) -> None:
    """The spawned process's entry point: `ops` and `out` are its ends of the two pipes."""
    started = time.monotonic()
    logging.basicConfig(level=spec.log_level, format=f"%(asctime)s talker-{spec.index} %(levelname)s %(name)s: "
                                                     "%(message)s")
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: the stacks, and the child goes on
    lock = threading.Lock()

    def send(msg) -> None:
        with lock:
            out.send(msg)

    def phase(name: str) -> None:
        log.info("talker process %d (%s): %s", spec.index, spec.device, name)
        send(Phase(name, time.monotonic() - started))

    try:
        phase("started")
        enter_device(spec.device)  # before the weights' CUDA IPC handles are opened, and for every CUDA call here
        phase(f"{spec.device} current")
        first = ops.recv()  # `Weights`: this frame holds the only reference
        phase("weights received")
        loop, runner = _child_loop(spec, first.tensors, send, phase)
    except BaseException as exc:  # noqa: B036 - reported to the parent, which refuses to start
        log.exception("talker process %d could not start", spec.index)
        send(Ready(f"{type(exc).__name__}: {exc}"))
        return
    del first
    send(Ready(None))
    voices: dict[int, CustomVoice] = {}
    device = torch.device(spec.device)
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    try:
        while True:
            try:
                op = ops.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            match op:
                case Enqueue():
                    loop.submit(replace(op, voice=voices[op.voice]))
                case Pause() | Resume() | Forget() | Drop():
                    loop.submit(op)
                case Voice(key=key, prompt=prompt, text=text):
                    prompt = VoicePrompt(move(prompt.spk_embed), move(prompt.prompt_lat), move(prompt.prompt_emb))
                    voices[key] = CustomVoice(f"talker-{key}", "", "", prompt, text, 0.0, 0)
                case Unvoice(key=key):
                    voices.pop(key, None)
                case AskStats():
                    send(Stats(loop.stats()))
                case CaptureGraphs():
                    phase("capturing graphs")
                    try:
                        loop.capture(lambda *args: send(Progress(args)))
                        phase("graphs captured")
                        send(Captured(None))
                    except Exception as exc:  # reported to the capturing caller
                        send(Captured(f"{type(exc).__name__}: {exc}"))
                case Stop():
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


def backends() -> dict:
    """This process's matmul precision switches (the child sets the parent's: it computes as the parent would)."""
    return {(kind, name): getattr(_backend(kind), name) for kind, name in _BACKENDS}


def _child_loop(spec: Spec, tensors: tuple, send, phase):
    from .models import adopt_replica
    from .talker_runner import TalkerRunner

    for (kind, name), value in spec.backends.items():
        setattr(_backend(kind), name, value)
    device = torch.device(spec.device)  # this thread's current device already (`child_main`)
    replica = adopt_replica(spec.checkpoint, spec.index, *tensors, device=device,
                            vae_device=torch.device(spec.vae_device), dtype=spec.dtype)
    phase(f"weights adopted on {replica.name}")
    bundle = _ChildBundle(spec.checkpoint, spec.dtype, spec.tokenizer, spec.special, hooks=spec.hooks)
    runner = TalkerRunner(bundle, spec.engine, replica)
    phase("runner built")
    reported, sent_any = [0], [False]

    def deliver(outputs: list) -> None:
        streams = runner.num_streams()
        if outputs or streams != reported[0]:
            reported[0] = streams
            send(Outputs(outputs, streams))
            if outputs and not sent_any[0]:
                sent_any[0] = True
                phase("first output sent")

    loop = TalkerLoop(runner, deliver, lambda events: send(Notices(events)), lambda reason: send(Died(reason)),
                      steps=spec.engine.talker.steps_per_launch, pipeline=spec.engine.talker.pipeline, trace=phase)
    return loop, runner
