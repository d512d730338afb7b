"""Raw client-side timelines: what one session saw during one turn, before any statistics.

All times are `clock()` (perf_counter seconds). `metrics` turns a `TurnTrace`
into the numbers of one sample; `client` fills it while the turn runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["ResponseTrace", "TurnTrace", "b64_num_bytes", "clock"]

# The one clock of every client timestamp: precise and read at the event itself (uvloop's
# loop.time() is cached per iteration at millisecond resolution).
clock = time.perf_counter


def b64_num_bytes(text: str) -> int:
    """Decoded size of a base64 string without decoding it (the reader's hot path)."""
    padding = 2 if text.endswith("==") else 1 if text.endswith("=") else 0
    return len(text) // 4 * 3 - padding


@dataclass(slots=True)
class ResponseTrace:
    """One server response: creation, every audio delta (arrival, samples), text, the end."""

    response_id: str
    created_at: float
    audio_at: list[float] = field(default_factory=list)  # arrival of each audio delta
    audio_num_samples: list[int] = field(default_factory=list)  # PCM16 samples in each delta
    first_text_at: float | None = None  # first transcript (or text) delta
    done_at: float | None = None
    status: str | None = None  # response.done status: completed | cancelled | failed | incomplete
    reason: str | None = None  # status_details.reason
    num_deltas_after_done: int = 0  # audio deltas that arrived after response.done (must stay 0)
    timings: dict[str, float] | None = None  # realtime_ming.response.timings (ms from input end)
    usage: dict | None = None

    def add_audio(self, t: float, num_samples: int) -> None:
        if self.done_at is not None:
            self.num_deltas_after_done += 1
        self.audio_at.append(t)
        self.audio_num_samples.append(num_samples)


@dataclass(slots=True)
class TurnTrace:
    """Everything one session saw while it spoke one turn (and, in barge-in mode, the interruption)."""

    session_index: int
    turn_index: int  # position in the session's plan (warmups first)
    turn_name: str
    is_warmup: bool
    speech_end_offset_s: float  # speech end within the sent audio
    speech_start_at: float | None = None  # when sample 0 was "spoken" (ideal microphone clock)
    speech_sent_at: float | None = None  # when the last speech frame was sent
    max_send_lag_s: float = 0.0  # worst lateness of a paced frame (client overload shows here)
    commit_sent_at: float | None = None  # manual mode
    speech_started_at: list[float] = field(default_factory=list)
    speech_stopped_at: list[float] = field(default_factory=list)
    committed_at: list[float] = field(default_factory=list)
    responses: list[ResponseTrace] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)  # error events {code, message, at}
    failure: str | None = None  # timeout, connection_closed, ... (set by the client)
    barge_turn_name: str | None = None
    barge_start_at: float | None = None  # barge-in speech sample 0
    barge_end_offset_s: float | None = None

    @property
    def speech_end_at(self) -> float | None:
        """When the user stopped speaking (last non-silent sample), on the client clock."""
        if self.speech_start_at is None:
            return None
        return self.speech_start_at + self.speech_end_offset_s
