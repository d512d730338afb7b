"""The engine thread's state of one active turn (engine thread only)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from .api import FinishReason, TurnRequest
from .commands import Sink
from .segmenter import Segmenter
from .tool_calls import ToolCallParser

__all__ = ["TurnState"]


@dataclass
class TurnState:
    request: TurnRequest
    sink: Sink
    held: list | None  # events of an unconfirmed speculative turn
    segmenter: Segmenter | None
    stages: dict = field(default_factory=dict)
    text: str = ""
    thinker_done: bool = False
    finish: FinishReason | None = None
    usage: tuple[int, int, int] = (0, 0, 0)  # prompt, cached, output tokens
    by_modality: tuple = (None, None)  # (prompt, cached) PromptTokens
    audio_samples: int = 0
    talker_steps: int = 0
    t0_ms: float = 0.0
    ended: bool = False  # the terminal event was delivered (or held): nothing more reaches the sink
    tool_parser: ToolCallParser | None = None  # the request has tools: calls are parsed out of the text
    prepared: Future | None = None  # its input processing, until the turn is admitted to the thinker
    thinker_paused: bool = False  # unconfirmed speculative turn: its thinker row is out of the decode batch
    talker_paused: bool = False  # ... and its talker work is parked (`engine/speculation.py`)
