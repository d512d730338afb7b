"""Session stage configuration: server-side defaults of a Realtime session and its limits.

These are the values a new connection starts with (its `session.created`) and the caps the
session enforces on every client event. The wire session object lives in `protocol`; VAD timing
parameters are the audio stage's `TurnDetectorConfig` (not repeated here). Frozen dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..audio.config import TurnDetectorConfig
from ..protocol.session import DEFAULT_OUTPUT_LEAD_MS, OUTPUT_LEAD_RANGE_MS

__all__ = ["VAD_BACKENDS", "SessionSettings", "VadSettings"]

VAD_BACKENDS = ("silero", "webrtc")


@dataclass(frozen=True, slots=True)
class VadSettings:
    """server_vad defaults (docs/protocol.md §3.3); `detector` holds threshold and timings."""

    enabled: bool = True  # new sessions start with server_vad (false: turn_detection null)
    backend: str = "silero"  # "silero" (ONNX, default) | "webrtc" (light; flags noise as speech)
    create_response: bool = True
    interrupt_response: bool = True
    detector: TurnDetectorConfig = field(default_factory=TurnDetectorConfig)

    def __post_init__(self) -> None:
        if self.backend not in VAD_BACKENDS:
            raise ValueError(f"session.vad.backend must be one of {VAD_BACKENDS}, got {self.backend!r}")


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """Defaults of a new session and the per-session limits."""

    instructions: str = ""  # default system prompt ("" = none)
    voice: str | None = None  # default voice (None = the engine's default voice)
    temperature: float = 0.0  # thinker sampling; 0 = greedy
    max_output_tokens: int = 512  # per response, also what "inf" means
    vad: VadSettings = field(default_factory=VadSettings)
    max_input_audio_s: float = 60.0  # buffered, uncommitted input audio; beyond -> error event
    min_commit_ms: int = 100  # manual commit with less -> input_audio_buffer_commit_empty
    max_items: int = 256  # conversation items kept; the oldest are dropped beyond
    output_frame_ms: int = 40  # largest audio delta sent to the client (until the audio runs 2 s ahead of real time)
    # input audio ingestion: after a burst of audio_burst_s, appends are read at most max_audio_rate x real
    # time (the socket reader waits; TCP flow control holds the client). 0 = unpaced.
    max_audio_rate: float = 16.0
    audio_burst_s: float = 60.0
    max_out_of_band_responses: int = 2  # `conversation: "none"` responses running beside the main one
    # tokens of the prompt budget (the context minus the reply's room) that instructions and tools must leave for
    # the conversation, and the least `truncation.token_limits.post_instructions` accepted
    min_conversation_tokens: int = 64
    # the most unplayed reply audio a client holds (ms): audio deltas are paced to it, so an output hold at a possible
    # interruption is heard within it; None = unpaced (every delta as generated). Per session:
    # `realtime_ming.output_lead_ms` (docs/barge_in.md)
    output_lead_ms: int | None = DEFAULT_OUTPUT_LEAD_MS

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("session.temperature must be >= 0")
        if self.max_output_tokens < 1:
            raise ValueError("session.max_output_tokens must be >= 1")
        if self.max_input_audio_s <= 0:
            raise ValueError("session.max_input_audio_s must be > 0")
        if self.min_commit_ms < 0:
            raise ValueError("session.min_commit_ms must be >= 0")
        if self.max_items < 2:
            raise ValueError("session.max_items must be >= 2")
        if self.max_audio_rate < 0:
            raise ValueError("session.max_audio_rate must be >= 0 (0 = unpaced)")
        if self.audio_burst_s < 0:
            raise ValueError("session.audio_burst_s must be >= 0")
        if self.max_out_of_band_responses < 0:
            raise ValueError("session.max_out_of_band_responses must be >= 0")
        if self.min_conversation_tokens < 1:
            raise ValueError("session.min_conversation_tokens must be >= 1")
        if not 5 <= self.output_frame_ms <= 40:
            raise ValueError("session.output_frame_ms must be in [5, 40]")
        low, high = OUTPUT_LEAD_RANGE_MS
        if self.output_lead_ms is not None and not low <= self.output_lead_ms <= high:
            raise ValueError(f"session.output_lead_ms must be null (unpaced) or in [{low}, {high}] ms")
