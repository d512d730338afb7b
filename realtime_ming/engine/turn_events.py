"""What a turn streams back (`engine/api.py`'s contract): text deltas, 44.1 kHz PCM chunks, stage timestamps,
tool-call pieces, a turn judgement, then exactly one terminal event (`TurnDone`, `TurnCancelled` or `TurnFailed`
with its `FailureCode`). Values only: no torch tensors (audio is float32 numpy). Callers outside the engine import
these through `engine.api`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

import numpy as np

__all__ = [
    "OUTPUT_SAMPLE_RATE_HZ",
    "Stage",
    "FinishReason",
    "TextDelta",
    "AudioChunk",
    "StageMark",
    "PromptTokens",
    "TurnDone",
    "TurnJudgement",
    "TurnCancelled",
    "FailureCode",
    "EngineBusyError",
    "TurnFailed",
    "ToolCallStart",
    "ToolCallArguments",
    "ToolCallEnd",
    "TurnEvent",
]

OUTPUT_SAMPLE_RATE_HZ = 44100


class Stage(enum.Enum):
    """Per-turn timestamps (engine monotonic clock, seconds) in pipeline order."""

    SUBMITTED = "submitted"
    CONFIRMED = "confirmed"
    ENCODERS_DONE = "encoders_done"
    PREFILL_DONE = "prefill_done"
    FIRST_TOKEN = "first_token"
    FIRST_SEGMENT = "first_segment"
    FIRST_TALKER_STEP = "first_talker_step"
    FIRST_PCM = "first_pcm"
    THINKER_DONE = "thinker_done"
    DONE = "done"


class FinishReason(enum.Enum):
    STOP = "stop"  # end of turn token / stop string
    LENGTH = "length"  # max_tokens


@dataclass(frozen=True, slots=True)
class TextDelta:
    turn_id: str
    text: str


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """PCM at `sample_rate_hz` (44.1 kHz from the talker); `text` = the segment being spoken."""

    turn_id: str
    pcm: np.ndarray  # [samples] float32 in [-1, 1]
    sample_rate_hz: int = OUTPUT_SAMPLE_RATE_HZ
    segment_id: int = 0
    # held output of a speculative turn released at its confirm, coalesced (`engine/speculation.py`): sent as one
    # audio delta, not cut into frames (its length is bounded by engine.speculation_lookahead_ms)
    backlog: bool = False


@dataclass(frozen=True, slots=True)
class StageMark:
    turn_id: str
    stage: Stage
    t: float  # engine clock (time.monotonic), seconds


@dataclass(frozen=True, slots=True)
class PromptTokens:
    """A prompt's tokens by modality: audio / image = the media placeholder tokens (video frames count as
    image), text = every other token (chat template, text, the media block's start/end markers)."""

    text: int = 0
    audio: int = 0
    image: int = 0

    @property
    def total(self) -> int:
        return self.text + self.audio + self.image


@dataclass(frozen=True, slots=True)
class TurnDone:
    """`prompt` / `cached` split `prompt_tokens` / `cached_tokens` by modality (None from engines that do not
    report it); `talker_steps` = talker autoregressive steps run for this turn (its output audio tokens)."""

    turn_id: str
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    audio_samples: int
    stages: dict  # Stage -> t
    prompt: PromptTokens | None = None
    cached: PromptTokens | None = None
    talker_steps: int = 0


@dataclass(frozen=True, slots=True)
class TurnJudgement:
    """A `JUDGE_TURN` turn's answer: the thinker's probability that the user's turn is complete (softmax of
    the "Yes" and "No" answers' next-token logits; the `forced_turn_judgement` hook in tests and
    benchmarks). Emitted once, right before the turn's `TurnDone`."""

    turn_id: str
    p_complete: float


@dataclass(frozen=True, slots=True)
class TurnCancelled:
    turn_id: str
    text: str  # what had been generated when the cancel applied


class FailureCode(enum.Enum):
    """Why a turn failed (machine-readable; the session maps it to the `response.done` error code)."""

    ENGINE_ERROR = "engine_error"  # a model step failed: the turns in that step fail, the engine lives on
    ADMISSION_FAILED = "admission_failed"  # an unexpected error while preparing this turn (a bug, reported)
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # the conversation does not fit, even truncated as asked
    INVALID_PROMPT = "invalid_prompt"  # the conversation cannot be prompted (too long, media the model rejects)
    ENGINE_BUSY = "engine_busy"  # no capacity for another turn now (every KV slot / row taken): retry later
    ENGINE_UNAVAILABLE = "engine_unavailable"  # the engine is stopped or dead: every turn fails at once
    SHUTTING_DOWN = "shutting_down"  # the server is draining and starts no new turn (set by the server)
    TASK_UNAVAILABLE = "task_unavailable"  # this engine does not run the request's task (`engine_supports`)


class EngineBusyError(RuntimeError):
    """Raised during admission when the engine has no capacity for the turn (reported as ENGINE_BUSY)."""


@dataclass(frozen=True, slots=True)
class TurnFailed:
    turn_id: str
    message: str  # for logs; clients see the code's own wording
    code: FailureCode = FailureCode.ENGINE_ERROR


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """The model began a call of `name` (one of the request's tools); never spoken."""

    turn_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    """More of the current call's arguments JSON text."""

    turn_id: str
    delta: str


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """The current call ended: `arguments` (JSON object text) when well formed, else `error` says why
    (not JSON, unknown function, unterminated). `name` is None when it could not be read."""

    turn_id: str
    name: str | None
    arguments: str | None
    error: str | None = None


TurnEvent = Union[TextDelta, AudioChunk, StageMark, TurnDone, TurnCancelled, TurnFailed,
                  ToolCallStart, ToolCallArguments, ToolCallEnd, TurnJudgement]
