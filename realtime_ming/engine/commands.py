"""The engine thread's commands: what callers (any thread) put in its inbox, applied at step boundaries."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Union

from .api import TurnEvent, TurnRequest

__all__ = ["Cancel", "Capture", "CloseConversation", "Command", "Confirm", "Discard", "EngineStats", "InputsReady",
           "Sink", "Stats", "Stop", "Submit", "Wake"]

Sink = Callable[[TurnEvent], None]


@dataclass(frozen=True, slots=True)
class Submit:
    """Start a turn; `prepared` is its input processing (a Future of PreparedInputs), started at submission."""

    request: TurnRequest
    sink: Sink
    prepared: Future


@dataclass(frozen=True, slots=True)
class InputsReady:
    """A submitted turn's input processing finished (posted by the worker): admit it to the thinker."""

    turn_id: str
    prepared: Future


@dataclass(frozen=True, slots=True)
class Wake:
    """An admitted turn's encoders finished (posted by the encoder worker): the next step completes its admission."""


@dataclass(frozen=True, slots=True)
class Confirm:
    turn_id: str


@dataclass(frozen=True, slots=True)
class Discard:
    turn_id: str


@dataclass(frozen=True, slots=True)
class Cancel:
    turn_id: str


@dataclass(frozen=True, slots=True)
class CloseConversation:
    conversation_id: str


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Occupancy snapshot (tests assert that cancels leak nothing)."""

    turns: int
    thinker_rows: int
    talker_streams: int
    cached_conversations: int
    queued_commands: int
    preparing: int = 0  # submitted turns whose inputs are still being prepared (off the engine thread)
    held_events: int = 0  # events held by unconfirmed speculative turns (bounded: `engine/speculation.py`)
    paused_turns: int = 0  # unconfirmed speculative turns the speculation bound paused (consuming nothing now)


@dataclass(frozen=True, slots=True)
class Stats:
    """Answer with an EngineStats in `box`, then set `done`."""

    box: list
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, slots=True)
class Capture:
    """Capture the CUDA graphs; a failure goes to `errors`; `done` is set either way."""

    progress: Callable[[str, int, int], None] | None
    done: threading.Event = field(default_factory=threading.Event)
    errors: list = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Command = Union[Submit, InputsReady, Wake, Confirm, Discard, Cancel, CloseConversation, Stats, Capture, Stop]
