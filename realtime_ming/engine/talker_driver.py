"""The talker driver interface: what the engine calls on its talker, and the typed ops every driver applies.

The engine drives its talker through `TalkerDriver` alone (`engine.talker.driver` picks the implementation):

* `inline` (`engine/talker_inline.py`): the engine thread steps the talker once per engine step, beside the
  thinker's step (`launch`, then `outputs`; pipelined with `engine.talker.pipeline`: `outputs` reads the step the
  last engine step queued);
* `process` (`engine/talker_process.py`): each talker replica steps at its own pace in a process of its own; the
  engine thread only sends it ops, `outputs` returns what it reported, and its PCM reaches the turns from the
  driver's reader thread (`deliver`).

Several replicas (`engine.placement.talker_devices`): a `TalkerPool` (`engine/talker_pool.py`) of drivers, itself a
driver. The ops (`Enqueue`, `Pause`, `Resume`, `Forget`) are applied to a `TalkerRunner` by `apply_op`, by the
inline driver on the engine thread and by the talker process's loop (`engine/talker_loop.py`) after the pipe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .voice_store import CustomVoice

if TYPE_CHECKING:  # pragma: no cover
    from .talker_runner import TalkerOutput, TalkerRunner
    from .talker_step import Progress

__all__ = ["Enqueue", "Forget", "Idle", "Pause", "Resume", "TalkerDriver", "TalkerOp", "apply_op"]



@dataclass(frozen=True, slots=True)
class Enqueue:
    """Speak `text` (one segment of `turn_id`) in `voice`: a preset's name, a cloned voice, None (the default) or,
    on the pipe to a talker process, the key of a prompt sent before (`talker_process.py`)."""

    turn_id: str
    segment_id: int
    text: str
    voice: str | CustomVoice | int | None
    seed: int | None = None
    caption: str | None = None


@dataclass(frozen=True, slots=True)
class Pause:
    """Stop stepping the turn until `Resume` (an unconfirmed speculative turn that holds enough audio)."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class Resume:
    turn_id: str


@dataclass(frozen=True, slots=True)
class Forget:
    """The turn ended (finished, failed, cancelled, discarded): free its streams and bookkeeping."""

    turn_id: str


TalkerOp = Enqueue | Pause | Resume | Forget


def apply_op(runner: TalkerRunner, op: TalkerOp) -> None:
    """Apply one op to a runner (between its steps)."""
    match op:
        case Enqueue():
            runner.enqueue(op.turn_id, op.segment_id, op.text, op.voice, seed=op.seed, caption=op.caption)
        case Pause():
            runner.pause(op.turn_id)
        case Resume():
            runner.resume(op.turn_id)
        case Forget():
            runner.forget(op.turn_id)
        case _:
            raise TypeError(f"not a talker op: {op!r}")


@dataclass(frozen=True, slots=True)
class Idle:
    """A talker stepped elsewhere has no work left for `turn_id` after applying its `seq`-th `Enqueue`."""

    turn_id: str
    seq: int


class TalkerDriver(Protocol):
    """The engine's talker. Engine thread only, except `drop` (any thread)."""

    def enqueue(self, op: Enqueue) -> None:
        """Queue a segment to speak (its turn's segments are spoken in order)."""

    def pause(self, turn_id: str) -> None: ...

    def resume(self, turn_id: str) -> None: ...

    def forget(self, turn_id: str) -> None:
        """The turn ended: its talker work stops and nothing more of it is reported."""

    def drop(self, turn_id: str) -> None:
        """Any thread, at once (a cancel, a discard): no more output of the turn reaches the engine, even before the
        engine thread applies the command and forgets the turn."""

    def pending(self, turn_id: str) -> bool:
        """Whether talker work queued for the turn is not known to be done."""

    def has_work(self) -> bool:
        """Whether the engine must keep stepping for this talker (False for a talker that steps itself)."""

    def launch(self) -> None:
        """Queue this engine step's talker step (beside the thinker's); `outputs` collects it."""

    def outputs(self) -> list[TalkerOutput]:
        """What the engine thread must act on since the last call: the step `launch` queued (PCM, first steps) and
        failed turns (`error` set). A driver that delivers PCM itself returns only its failures."""

    def num_streams(self) -> int: ...

    def capture(self, progress: Progress | None = None) -> None:
        """Capture the talker's CUDA graphs (startup); raises what the capture raised."""

    def stats(self) -> dict | None:
        """Running totals of the talker's loop (`engine.talker.driver: process`; any thread), else None."""

    def close(self) -> None: ...
