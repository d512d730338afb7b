"""Benchmark configuration: what to hit (`Target`), how to speak (`TurnMode`) and the sweep (`BenchConfig`).

Frozen dataclasses with units in the field names; `BenchConfig.to_json()` is the exact config
written into every result file.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["BenchConfig", "Target", "TurnMode", "http_base"]


class TurnMode(enum.Enum):
    """How a turn ends: the server's VAD hears the silence, or the client commits."""

    VAD = "vad"  # server_vad; the microphone keeps streaming silence between turns
    MANUAL = "manual"  # turn_detection null; commit + response.create right after the speech


@dataclass(frozen=True, slots=True)
class Target:
    """One server (or one configuration of a server) to measure.

    `session` is merged into the GA `session.update` the bench sends (e.g. a different VAD
    silence), so two targets may share a URL and differ only in config.
    """

    name: str
    url: str  # ws(s)://host:port/v1/realtime[?model=...]
    api_key: str | None = None
    model: str | None = None  # sent as ?model= when the URL has none
    session: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("target name must be non-empty")
        if urlsplit(self.url).scheme not in ("ws", "wss"):
            raise ValueError(f"target {self.name}: url must start with ws:// or wss://, got {self.url!r}")

    @property
    def ws_url(self) -> str:
        """The URL to connect to, with `?model=` added when configured and absent."""
        parts = urlsplit(self.url)
        if self.model is None or "model=" in parts.query:
            return self.url
        query = f"{parts.query}&model={self.model}" if parts.query else f"model={self.model}"
        return urlunsplit(parts._replace(query=query))


def http_base(ws_url: str) -> str:
    """`ws://h:p/v1/realtime?..` → `http://h:p` (where /health and /v1/models live)."""
    parts = urlsplit(ws_url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return urlunsplit((scheme, parts.netloc, "", "", ""))


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One benchmark run: targets × concurrency levels × rounds, each session speaking turns.

    Every level run opens `concurrency` sessions at once (closed loop); each speaks
    `num_warmup_turns` excluded turns, then `num_turns` measured ones. With two targets the
    level runs alternate A, B, B, A, ... (`num_rounds` times per level) so drift hits both.
    """

    targets: tuple[Target, ...]
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    num_turns: int = 3  # measured turns per session
    num_warmup_turns: int = 1  # per session, excluded from the statistics
    num_rounds: int = 1  # level runs per (target, concurrency)
    mode: TurnMode = TurnMode.VAD
    barge_in: bool = False  # speak the next turn while the response plays
    barge_in_after_ms: float = 300.0  # after the first audio delta
    frame_ms: int = 20  # microphone frame (one input_audio_buffer.append)
    sample_rate_hz: int = 24000  # GA audio/pcm
    pause_s: float = 0.5  # silence between a response's end and the next turn
    stagger_s: float = 1.0  # sessions start at seeded random offsets in [0, stagger_s]
    turn_timeout_s: float = 120.0  # speech end → all responses of the turn done
    connect_timeout_s: float = 30.0
    timings_wait_s: float = 2.0  # wait for our timings event after response.done
    timing_events: bool = True  # ask for realtime_ming.response.timings (ignored by other servers)
    max_output_tokens: int | None = None  # None: the server's default
    instructions: str | None = None
    voice: str | None = None
    vad_silence_ms: int | None = None  # None: the server's default server_vad settings
    vad_threshold: float | None = None
    wav_dir: str | None = None  # extra user turns (*.wav, any rate, mixed to mono)
    use_default_turns: bool = True  # the espeak-ng set
    turns_cache_dir: str | None = None  # None: $XDG_CACHE_HOME/realtime-ming/bench-turns
    max_turn_s: float | None = None  # skip turns longer than this (speech, seconds)
    allow_silent: bool = False  # a response without audio passes (random-weight models); else it fails
    silence_dbfs: float = -50.0  # |x| below this is silence (finds a user wav's speech end)
    seed: int = 0
    out_dir: str | None = None  # None: bench/out/run-<utc timestamp> under the current directory
    show_progress: bool = True

    def __post_init__(self) -> None:
        checks = (
            (len(self.targets) in (1, 2), "targets: one target, or two for a comparison"),
            (len({t.name for t in self.targets}) == len(self.targets), "targets: names must differ"),
            (bool(self.concurrency) and min(self.concurrency) >= 1, "concurrency: levels must be >= 1"),
            (self.num_turns >= 1, "num_turns must be >= 1"),
            (self.num_warmup_turns >= 0, "num_warmup_turns must be >= 0"),
            (self.num_rounds >= 1, "num_rounds must be >= 1"),
            (5 <= self.frame_ms <= 200, "frame_ms must be in [5, 200]"),
            (self.sample_rate_hz == 24000, "sample_rate_hz: GA audio/pcm is 24000 only"),
            (self.pause_s >= 0 and self.stagger_s >= 0, "pause_s and stagger_s must be >= 0"),
            (self.turn_timeout_s > 0 and self.connect_timeout_s > 0, "timeouts must be > 0"),
            (self.barge_in_after_ms >= 0, "barge_in_after_ms must be >= 0"),
            (not (self.barge_in and self.mode is TurnMode.MANUAL), "barge_in needs mode vad"),
            (self.use_default_turns or self.wav_dir is not None, "no turns: enable default turns or give wav_dir"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def is_comparison(self) -> bool:
        return len(self.targets) == 2

    def to_json(self) -> dict[str, Any]:
        """The exact config as JSON values (API keys redacted)."""
        data = asdict(self)
        data["mode"] = self.mode.value
        for target in data["targets"]:
            target["api_key"] = None if target["api_key"] is None else "<redacted>"
        return data
