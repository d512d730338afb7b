"""End-of-turn model: Smart Turn v3.2 (ONNX, BSD-2, vendored in assets/smart_turn with its LICENSE).

The user's last ≤ 8 s of 16 kHz speech → probability that the turn is complete. Features are
whisper log-mel with 80 bins over exactly 8 s (audio left-padded with zeros, zero-mean unit-variance
normalised first), the numbers of `mel.log_mel_spectrogram` with an 80-bin Slaney filterbank: the
transformers `WhisperFeatureExtractor(chunk_length=8, do_normalize=True)` the model was trained on.

`SmartTurn.predict` is thread-safe: up to `max_concurrent` `InferenceSession.run` calls (one a core,
one intra-op thread each) run at once, and callers that arrive while all of them are busy are served
together by the next free one (no added wait when idle). On a 2-core AVX2 host one decision is ~80-90 ms
of one core whatever the batch (the ONNX is already int8 QDQ-quantized and its time axis is fixed at 800
frames), so throughput comes from using every core, not from larger batches.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from realtime_ming.audio.mel_filters import (
    MEL_HOP_SAMPLES,
    MEL_N_FFT,
    MEL_SAMPLE_RATE_HZ,
    slaney_mel_filterbank,
)

__all__ = [
    "EAGERNESS_POLICY",
    "SMART_TURN_NUM_BINS",
    "SMART_TURN_WINDOW_SAMPLES",
    "EndOfTurnPolicy",
    "SmartTurn",
    "decision_pool",
    "shared_smart_turn",
    "smart_turn_features",
    "smart_turn_model_path",
]

SMART_TURN_WINDOW_SAMPLES = 8 * MEL_SAMPLE_RATE_HZ  # the model sees the last 8 s
SMART_TURN_NUM_BINS = 80
_NUM_FRAMES = SMART_TURN_WINDOW_SAMPLES // MEL_HOP_SAMPLES  # 800
_NORM_EPS = 1e-7
_WINDOW = (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(MEL_N_FFT) / MEL_N_FFT)).astype(np.float32)  # periodic Hann


def _sparse_filterbank() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 80-bin Slaney filterbank as (FFT bin, weight) of its non-zeros, band-major, and each band's first index."""
    filters = slaney_mel_filterbank(num_bins=SMART_TURN_NUM_BINS)  # [80, 201]
    bands, cols = np.nonzero(filters)
    if np.any(np.bincount(bands, minlength=SMART_TURN_NUM_BINS) == 0):
        raise ValueError("a mel band of the Smart Turn filterbank has no weight")
    return cols, filters[bands, cols], np.searchsorted(bands, np.arange(SMART_TURN_NUM_BINS))


_FILTER_COLS, _FILTER_WEIGHTS, _FILTER_STARTS = _sparse_filterbank()


def smart_turn_model_path() -> Path:
    """The vendored `smart-turn-v3.2-cpu.onnx` (raises FileNotFoundError if the install lacks it)."""
    path = Path(__file__).resolve().parent.parent / "assets" / "smart_turn" / "smart-turn-v3.2-cpu.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"Smart Turn model missing: {path}")
    return path


def smart_turn_features(audio: np.ndarray) -> np.ndarray:
    """float32 16 kHz audio [n] → model input [80, 800]: last 8 s, zero-padded in front, normalised.

    The same numbers as `mel.log_mel_spectrogram` with the 80-bin filterbank (tests hold them to it), in
    single-threaded numpy: decisions run on several threads at once, and torch's intra-op pool spun up for
    each of them costs up to 10x the ~9 ms CPU of the FFT itself on a busy 2-core host."""
    x = np.asarray(audio, dtype=np.float32).reshape(-1)[-SMART_TURN_WINDOW_SAMPLES:]
    if x.size < SMART_TURN_WINDOW_SAMPLES:
        x = np.pad(x, (SMART_TURN_WINDOW_SAMPLES - x.size, 0))
    x = (x - x.mean()) / np.sqrt(x.var() + _NORM_EPS)
    padded = np.pad(x, MEL_N_FFT // 2, mode="reflect")  # centred frames, as torch.stft(center=True)
    frames = sliding_window_view(padded, MEL_N_FFT)[::MEL_HOP_SAMPLES][:_NUM_FRAMES]  # last frame dropped
    spec = np.fft.rfft(frames * _WINDOW, axis=-1)  # [800, 201] complex64
    power = np.square(spec.real) + np.square(spec.imag)
    # the filterbank's 391 non-zeros, band by band (a dense [800, 201] @ [201, 80] would go through BLAS threads)
    mel = np.add.reduceat(power[:, _FILTER_COLS] * _FILTER_WEIGHTS, _FILTER_STARTS, axis=1)  # [800, 80]
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return np.ascontiguousarray(((log_spec + 4.0) / 4.0).T, dtype=np.float32)


def _create_session(path: Path | None, num_threads: int) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = num_threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return onnxruntime.InferenceSession(
        str(path or smart_turn_model_path()), sess_options=options, providers=["CPUExecutionProvider"]
    )


class _Request:
    __slots__ = ("done", "error", "features", "prob")

    def __init__(self, features: np.ndarray) -> None:
        self.features = features
        self.prob = 0.0
        self.error: BaseException | None = None
        self.done = threading.Event()


class SmartTurn:
    """One shared ONNX session for all sessions of a server; `predict` may be called from any thread.

    A caller queues its features; while fewer than `max_concurrent` (default: one a core) callers are
    running batches it becomes one of them and runs batches over everything queued (up to `max_batch`)
    until the queue is empty; otherwise it waits for a running caller to serve it.
    """

    def __init__(
        self,
        path: Path | None = None,
        *,
        num_threads: int = 1,
        max_batch: int = 16,
        max_concurrent: int | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch: must be >= 1, got {max_batch}")
        max_concurrent = (os.cpu_count() or 1) if max_concurrent is None else max_concurrent
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent: must be >= 1, got {max_concurrent}")
        self._session = _create_session(path, num_threads)
        self._input_name = self._session.get_inputs()[0].name
        self._max_batch = max_batch
        self._max_concurrent = max_concurrent
        self._lock = threading.Lock()
        self._queue: list[_Request] = []
        self._num_running = 0  # callers running batches now

    def predict_batch(self, clips: list[np.ndarray]) -> np.ndarray:
        """Complete-turn probabilities [len(clips)] of 16 kHz float32 clips (one ONNX call)."""
        feats = np.stack([smart_turn_features(c) for c in clips])  # [B, 80, 800]
        return self._run(feats)

    def predict(self, audio: np.ndarray) -> float:
        """Complete-turn probability of one clip; concurrent callers share batches."""
        request = _Request(smart_turn_features(audio))
        with self._lock:
            self._queue.append(request)
            lead = self._num_running < self._max_concurrent
            self._num_running += lead
        if lead:
            self._drain()
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.prob

    def _drain(self) -> None:
        while True:
            with self._lock:
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
                if not batch:
                    self._num_running -= 1
                    return
            try:
                probs = self._run(np.stack([r.features for r in batch]))
                for r, p in zip(batch, probs, strict=True):
                    r.prob = float(p)
            except BaseException as exc:  # every waiter learns of the failure, none hangs
                for r in batch:
                    r.error = exc
            for r in batch:
                r.done.set()

    def _run(self, feats: np.ndarray) -> np.ndarray:
        (out,) = self._session.run(None, {self._input_name: feats.astype(np.float32, copy=False)})
        return np.asarray(out, dtype=np.float32).reshape(-1)


@dataclass(frozen=True, slots=True)
class EndOfTurnPolicy:
    """semantic_vad at one eagerness: after `decide_after_ms` of silence Smart Turn is asked once;
    probability >= `threshold` ends the turn there, otherwise the turn ends after `fallback_ms` of
    silence (OpenAI's documented maximum waits: low 8 s, medium/auto 4 s, high 2 s).

    Where the engine judges the words too (`TurnTask.JUDGE_TURN`, asked with the speculative reply at the
    pause), prosody's "complete" ends the turn only if the thinker's P(complete) is >= `words_threshold`;
    below it the turn goes on (the silence fallback, or the next pause, decides). A judgement not in
    `words_wait_ms` (wall time) after the decision point is not waited for: prosody decides alone. Prosody's
    "incomplete" is overruled by the words only when they are sure: P(complete) >= `words_override` ends the turn
    at the decision point if their answer is in, or when it comes while the pause lasts (None: never overruled).
    Without a words judgement (the tiny / dummy models) prosody and the silence fallback decide as before.
    `words_decide_after_ms` (None: `decide_after_ms`) is the decision point where the words are judged: they guard
    against prosody's mid-sentence "complete", so the decision can come earlier than prosody alone can afford."""

    threshold: float
    decide_after_ms: int
    fallback_ms: int
    # The model call starts this much before the decision point (on the audio heard by then), so its
    # ~100+ ms of CPU overlaps the rest of the wait instead of following it.
    early_ms: int = 100
    words_threshold: float = 0.5
    words_wait_ms: int = 200
    words_override: float | None = None
    words_decide_after_ms: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold: must be in [0, 1], got {self.threshold}")
        if not 0 < self.decide_after_ms < self.fallback_ms:
            raise ValueError(f"need 0 < decide_after_ms < fallback_ms, got {self.decide_after_ms}, {self.fallback_ms}")
        if not 0 <= self.early_ms < self.decide_after_ms:
            raise ValueError(f"early_ms: must be in [0, decide_after_ms), got {self.early_ms}")
        if not 0.0 <= self.words_threshold <= 1.0:
            raise ValueError(f"words_threshold: must be in [0, 1], got {self.words_threshold}")
        if self.words_override is not None and not self.words_threshold <= self.words_override <= 1.0:
            raise ValueError(f"words_override: must be in [words_threshold, 1] or None, got {self.words_override}")
        if self.words_decide_after_ms is not None and not self.early_ms < self.words_decide_after_ms < self.fallback_ms:
            raise ValueError(f"words_decide_after_ms: must be in (early_ms, fallback_ms), got {self.words_decide_after_ms}")
        if self.words_wait_ms < 0:
            raise ValueError(f"words_wait_ms: must be >= 0, got {self.words_wait_ms}")

    def with_words(self) -> EndOfTurnPolicy:
        """This policy where a words judgement is asked at each pause (its decision point `words_decide_after_ms`)."""
        if self.words_decide_after_ms is None:
            return self
        return replace(self, decide_after_ms=self.words_decide_after_ms, words_decide_after_ms=None)

    @property
    def start_after_ms(self) -> int:
        """Silence after which the model call starts."""
        return self.decide_after_ms - self.early_ms


# "high" ends a turn on weaker evidence, "low" lets the user take their time: it asks only after 800 ms
# of silence, so a mid-sentence pause shorter than that never splits the turn whatever its prosody
# (Smart Turn judges prosody: on espeak-ng speech it calls "I'd like to book a table for" complete).
# The words' threshold follows the same order: "high" ends unless the thinker leans towards "not finished".
# Prosody alone decides at 200 ms (measured best of 120 / 160 / 200 for it: an earlier call hears less silence and
# splits more); with the words judged, the words guard the mid-sentence pauses and "high" decides at 120 ms (the
# speculative pause, where the judgement is asked), "medium"/"auto" at 160 ms (docs/turn_detection.md).
EAGERNESS_POLICY: dict[str, EndOfTurnPolicy] = {
    "low": EndOfTurnPolicy(threshold=0.5, decide_after_ms=800, fallback_ms=8000, words_threshold=0.6,
                           words_override=0.95),
    "medium": EndOfTurnPolicy(threshold=0.5, decide_after_ms=200, fallback_ms=4000, words_threshold=0.5,
                              words_override=0.9, words_decide_after_ms=160),
    "auto": EndOfTurnPolicy(threshold=0.5, decide_after_ms=200, fallback_ms=4000, words_threshold=0.5,
                            words_override=0.9, words_decide_after_ms=160),
    "high": EndOfTurnPolicy(threshold=0.3, decide_after_ms=200, fallback_ms=2000, words_threshold=0.4,
                            words_override=0.8, words_decide_after_ms=120),
}

_SHARED: SmartTurn | None = None
_SHARED_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None


def decision_pool() -> ThreadPoolExecutor:
    """Process-wide threads that run end-of-turn calls started ahead of their decision point (one per
    core; concurrent calls share `SmartTurn` batches)."""
    global _POOL
    with _SHARED_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="end-of-turn")
        return _POOL


def shared_smart_turn() -> SmartTurn:
    """The process-wide `SmartTurn` (loaded on first use; one ONNX session batches every session's calls)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = SmartTurn()
        return _SHARED
