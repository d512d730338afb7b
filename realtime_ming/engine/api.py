"""The engine's public contract, shared by the server's session layer and the SDK.

A caller submits a `TurnRequest` and receives an ordered stream of `TurnEvent`s for it
(text deltas, 44.1 kHz PCM chunks, stage timestamps, then exactly one terminal event:
`TurnDone`, `TurnCancelled` or `TurnFailed`). Speculative turns run fully but hold their
output until `confirm`; `discard` drops them without a trace. Values only — no asyncio,
no torch tensors cross this boundary (audio is float32 numpy). The events are defined in
`engine/turn_events.py`, the requests here.

The session layer imports the engine through this module only: what it shares with the engine and the model (a
cloned voice, the words-judgement question, the talker's style caption, the vision geometry) is defined or
re-exported here. Importing it loads neither torch nor Pillow.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Mapping, Protocol

import numpy as np

# What front ends share with the model, re-exported so that they import the engine's API only: the talker's
# style caption and the geometry of the vision pre-processing (both torch-free).
from ..model.talker_caption import TalkerCaption
from ..model.vision_geometry import VideoSampling, resize_bicubic, smart_resize, video_frame_size, video_grid_indices
from .turn_events import (
    OUTPUT_SAMPLE_RATE_HZ,
    AudioChunk,
    EngineBusyError,
    FailureCode,
    FinishReason,
    PromptTokens,
    Stage,
    StageMark,
    TextDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    TurnCancelled,
    TurnDone,
    TurnEvent,
    TurnFailed,
    TurnJudgement,
)

if TYPE_CHECKING:  # a cloned voice only holds the prompt: the front-end processes import this without torch
    from ..model.talker import VoicePrompt

__all__ = [
    "OUTPUT_SAMPLE_RATE_HZ",
    "ContentKind",
    "Content",
    "Message",
    "SamplingParams",
    "Truncation",
    "TurnRequest",
    "PromptTokens",
    "TurnTask",
    "TextDelta",
    "AudioChunk",
    "StageMark",
    "TurnDone",
    "TurnCancelled",
    "TurnFailed",
    "TurnJudgement",
    "FailureCode",
    "EngineBusyError",
    "EngineHealth",
    "engine_health",
    "ToolCall",
    "ToolCallStart",
    "ToolCallArguments",
    "ToolCallEnd",
    "TurnEvent",
    "Stage",
    "FinishReason",
    "EngineHandle",
    "PromptMeter",
    "engine_prompt_meter",
    "engine_supports",
    "CUSTOM_VOICE_PREFIX",
    "CustomVoice",
    "TURN_QUESTION",
    "judgement_history",
    "TalkerCaption",
    "VideoSampling",
    "resize_bicubic",
    "smart_resize",
    "video_frame_size",
    "video_grid_indices",
]

class ContentKind(enum.Enum):
    TEXT = "text"
    AUDIO = "audio"  # float32 mono PCM, `sample_rate_hz` given
    IMAGE = "image"  # uint8 HWC RGB array
    VIDEO = "video"  # uint8 [frames, H, W, 3] already sampled, with `fps`


@dataclass(frozen=True, slots=True)
class Content:
    """One piece of a message: exactly one of text / audio / image / video is set."""

    kind: ContentKind
    text: str | None = None
    audio: np.ndarray | None = None  # [samples] float32
    sample_rate_hz: int | None = None
    image: np.ndarray | None = None  # [H, W, 3] uint8
    video: np.ndarray | None = None  # [F, H, W, 3] uint8
    fps: float | None = None

    def __post_init__(self):
        if self.kind is ContentKind.TEXT and self.text is None:
            raise ValueError("text content needs text")
        if self.kind is ContentKind.AUDIO and (self.audio is None or not self.sample_rate_hz):
            raise ValueError("audio content needs audio and sample_rate_hz")
        if self.kind is ContentKind.IMAGE and self.image is None:
            raise ValueError("image content needs image")
        if self.kind is ContentKind.VIDEO and (self.video is None or not self.fps):
            raise ValueError("video content needs video and fps")

    @classmethod
    def of_text(cls, text: str) -> "Content":
        return cls(ContentKind.TEXT, text=text)

    @classmethod
    def of_audio(cls, audio: np.ndarray, sample_rate_hz: int) -> "Content":
        return cls(ContentKind.AUDIO, audio=np.asarray(audio, dtype=np.float32), sample_rate_hz=sample_rate_hz)

    @classmethod
    def of_image(cls, image: np.ndarray) -> "Content":
        return cls(ContentKind.IMAGE, image=np.asarray(image, dtype=np.uint8))


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the assistant made: `arguments` is its JSON object text."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Message:
    """A conversation message; role is "system", "user", "assistant" or "tool" (a function's result, as
    text). An assistant message may carry the function calls it made after its text (`tool_calls`)."""

    role: str
    content: tuple[Content, ...]
    tool_calls: tuple[ToolCall, ...] = ()

    def __post_init__(self):
        if self.role not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"unknown role {self.role!r}")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool calls")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Thinker sampling; temperature 0 = greedy. `seed` makes sampling reproducible per turn."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # benchmarks: fixed output lengths

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")


class TurnTask(enum.Enum):
    """What a turn is for. `TRANSCRIBE` is a side request (the user's speech as text, never spoken):
    its prefill queues behind every reply's, and the `forced_transcript` hook (not
    `forced_reply`; `engine/hooks.py`) replaces its sampled tokens in tests and benchmarks.

    `JUDGE_TURN` is a side request too (never spoken, nothing sampled): its prompt asks whether the user has
    finished their turn (`engine/turn_judgement.py`), and the turn answers with one `TurnJudgement` (the
    thinker's P("Yes") over "Yes"/"No" at the next token), then `TurnDone`. Its prefill queues behind every
    reply's; an engine without it (`engine.thinker.turn_judgement` off, see `engine_supports`) fails it at once
    with `TASK_UNAVAILABLE`."""

    REPLY = "reply"
    TRANSCRIBE = "transcribe"
    JUDGE_TURN = "judge_turn"


@dataclass(frozen=True, slots=True)
class Truncation:
    """What the engine does when the prompt would not fit the context (OpenAI `session.truncation`).

    `mode` "auto": drop the oldest history messages (never the system prompt) until it fits;
    "disabled": fail the turn with code `context_length_exceeded`; "retention_ratio": when it
    no longer fits, drop the oldest messages until the history holds at most `retention_ratio`
    of the limit (one larger cut that keeps the cached prefix valid for the next turns).
    `post_instructions` lowers the history's limit (tokens after the system prompt).
    """

    mode: str = "auto"
    retention_ratio: float = 1.0
    post_instructions: int | None = None

    def __post_init__(self):
        if self.mode not in ("auto", "disabled", "retention_ratio"):
            raise ValueError(f"unknown truncation mode {self.mode!r}")
        if not 0.0 <= self.retention_ratio <= 1.0:
            raise ValueError("retention_ratio must be in [0, 1]")
        if self.post_instructions is not None and self.post_instructions < 1:
            raise ValueError("post_instructions must be >= 1")


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """One response to generate.

    `conversation_id` names the thinker KV slot to reuse: when `history` extends what that
    conversation already has cached, only the new tokens are prefilled. `history` is the full
    conversation so far (earlier turns + the new user message) ending with the user turn.
    """

    turn_id: str
    conversation_id: str
    history: tuple[Message, ...]
    system: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # a checkpoint voice's name, a voice cloned at run time (`voice_store.CustomVoice`), or None = the default
    voice: Any = None
    with_audio: bool = True
    speculative: bool = False
    # the talker's style caption (`model/talker_caption.py`: speech rate, emotion, dialect, …); None = none
    caption: str | None = None
    truncation: Truncation = field(default_factory=Truncation)
    task: TurnTask = TurnTask.REPLY
    # function tools rendered into the system turn as the chat template does (each a JSON object)
    tools: tuple[Mapping[str, Any], ...] = ()
    # text (tool markers become their special tokens) the reply is forced to start with: constrained
    # decoding of a required / named function call's prefix
    forced_prefix: str = ""
    # the reply starts with `forced_prefix` + one of these (a `required` call names one of the offered functions):
    # the tokens the choices share are forced, where they differ the model's logits are masked to theirs
    forced_choices: tuple[str, ...] = ()
    # a side request (a transcription): the conversation whose KV slot it starts from. Its prompt shares that
    # conversation's running prompt up to some point (e.g. through the user's audio); the engine admits it once
    # that conversation's turn has prefilled its prompt, copies the shared prefix's K/V (`KVSlotManager.fork`)
    # and prefills only the rest
    prefix_from: str | None = None


@dataclass(frozen=True, slots=True)
class EngineHealth:
    """`alive` False: the engine serves no more turns (every submit fails at once with ENGINE_UNAVAILABLE);
    `reason` says why (thread died, a tensor-parallel worker exited, closed)."""

    alive: bool
    reason: str | None = None


def engine_health(engine: object) -> EngineHealth:
    """`engine.health()`, or alive for a handle that does not report health (scripted test engines)."""
    health = getattr(engine, "health", None)
    return health() if callable(health) else EngineHealth(True)


class EngineHandle(Protocol):
    """What the session layer needs from an engine (thread-safe; callbacks on the caller's loop)."""

    def submit(self, request: TurnRequest, sink) -> None:
        """Start `request`; `sink(event: TurnEvent)` is called (on the caller's event loop) per event."""

    def confirm(self, turn_id: str) -> None:
        """Release a speculative turn's held output and keep it running."""

    def discard(self, turn_id: str) -> None:
        """Drop a speculative turn silently and free everything it holds (no terminal event)."""

    def cancel(self, turn_id: str) -> None:
        """Stop a turn at the next step boundary; emits TurnCancelled."""

    def close_conversation(self, conversation_id: str) -> None:
        """Free the conversation's cached KV slot."""

    def health(self) -> EngineHealth:
        """Whether the engine still serves turns (cheap, any thread; optional: see `engine_health`)."""

    def supports(self, task: TurnTask) -> bool:
        """Whether this engine runs turns of `task` (cheap, any thread; optional: see `engine_supports`)."""


def engine_supports(engine: object, task: TurnTask) -> bool:
    """`engine.supports(task)`; a handle that does not say runs replies and transcriptions only."""
    supports = getattr(engine, "supports", None)
    if callable(supports):
        return bool(supports(task))
    return task is not TurnTask.JUDGE_TURN


class PromptMeter(Protocol):
    """Measures a session's fixed prompt parts in tokens, so that settings that cannot fit are refused where they are
    accepted (`session.update`, `response.create`) rather than failing every turn. Thread-safe; a call may take
    milliseconds (it encodes at most about a context's worth of text, then caches): call it off the event loop.

    `max_seq_len`: the thinker's context (prompt + reply), tokens. `caption_budget`: talker tokens a speech-style
    caption may take (`TurnRequest.caption`)."""

    max_seq_len: int
    caption_budget: int

    def system_tokens(self, system: str | None, tools: tuple[Mapping[str, Any], ...]) -> int:
        """Thinker tokens of the system turn for `system` and `tools` (as `TurnRequest` carries them) plus the
        generation prompt: what a turn's prompt takes before any message. Above `max_seq_len` the count is where
        measuring stopped (a lower bound)."""

    def caption_tokens(self, caption: str) -> int:
        """Talker tokens `caption` takes in each talker prompt of a spoken turn (0 without a talker)."""


def engine_prompt_meter(engine: object) -> PromptMeter | None:
    """`engine.prompt_meter()`, or None for a handle that cannot measure prompts (scripted test engines): the
    session then leaves every budget to the engine's turn-time checks."""
    meter = getattr(engine, "prompt_meter", None)
    return meter() if callable(meter) else None


# ---- voices cloned at run time (`voice_store`) ----------------------------------------------------------
CUSTOM_VOICE_PREFIX = "voice_"  # GA custom voices: {"id": "voice_..."}


@dataclass(frozen=True, eq=False)
class CustomVoice:
    """A registered voice: the talker's voice prompt and the transcript it was registered with."""

    id: str
    owner: str
    name: str
    prompt: VoicePrompt = field(repr=False)
    prompt_text: str
    duration_s: float
    nbytes: int
    created_at: int = field(default_factory=lambda: int(time.time()))

    def describe(self) -> dict:
        """The public record (OpenAI's `audio.voice` shape plus our fields)."""
        return {"id": self.id, "object": "audio.voice", "type": "audio_sample", "name": self.name,
                "created_at": self.created_at, "duration_s": round(self.duration_s, 3),
                "transcript": self.prompt_text, "speaker_embedding": self.prompt.spk_embed is not None}


# ---- the words judgement of a turn (`turn_judgement`, `TurnTask.JUDGE_TURN`) ----------------------------
TURN_QUESTION: Final = ("Has the speaker finished their sentence and their turn, or did they stop in the middle and "
                        "will go on? Answer Yes if they finished, No if they will go on.")


def judgement_history(history: tuple[Message, ...]) -> tuple[Message, ...]:
    """`history` (a reply's, ending with the user's turn) with the question following that turn's content.
    Raises ValueError when it does not end with a user turn."""
    if not history or history[-1].role != "user":
        raise ValueError("a turn judgement needs a history that ends with the user's turn")
    last = history[-1]
    return history[:-1] + (Message("user", last.content + (Content.of_text(TURN_QUESTION),)),)
