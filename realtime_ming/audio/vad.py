"""Frame-level voice activity detection behind one interface: fixed 16 kHz windows → speech probability.

`SileroVad` (default) runs the Silero v5/v6 ONNX model from the `silero-vad` wheel with onnxruntime
(the `silero_vad` package itself is never imported: it sets torch to one thread process-wide).
`WebRtcVad` wraps `webrtcvad` (0/1 decisions); it flags −40 dBFS white noise as speech, so it is
never the default. Each detector owns its recurrent state; an InferenceSession may be shared.
"""

from __future__ import annotations

import enum
import importlib.util
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from realtime_ming.audio.pcm import float_to_pcm16

__all__ = [
    "VAD_SAMPLE_RATE_HZ",
    "VadKind",
    "VadBackend",
    "SileroVad",
    "WebRtcVad",
    "silero_model_path",
    "create_silero_session",
    "create_vad",
]

VAD_SAMPLE_RATE_HZ = 16000


class VadKind(str, enum.Enum):
    """Available VAD backends (config value)."""

    SILERO = "silero"
    WEBRTC = "webrtc"


class VadBackend(Protocol):
    """A stateful frame classifier over consecutive 16 kHz windows of `window_num_samples`."""

    @property
    def window_num_samples(self) -> int:
        """Samples per window (16 kHz) that `speech_prob` expects."""

    def speech_prob(self, window: np.ndarray) -> float:
        """Speech probability in [0, 1] of the next float32 window [window_num_samples]."""

    def reset(self) -> None:
        """Forget all state, as for a new stream."""


def silero_model_path() -> Path:
    """Path of `silero_vad.onnx` inside the installed `silero-vad` wheel (without importing it).

    Raises FileNotFoundError when the package or the file is missing.
    """
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package silero-vad is not installed (pip install silero-vad --no-deps)")
    for location in spec.submodule_search_locations:
        path = Path(location) / "data" / "silero_vad.onnx"
        if path.is_file():
            return path
    raise FileNotFoundError("silero_vad.onnx not found inside the silero-vad package")


def create_silero_session(path: Path | None = None) -> Any:
    """A CPU onnxruntime InferenceSession for Silero, one intra-op and one inter-op thread.

    One session may be shared by many `SileroVad` objects (state lives in each detector).
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(
        str(path or silero_model_path()), sess_options=options, providers=["CPUExecutionProvider"]
    )


class SileroVad:
    """Silero VAD v5/v6 at 16 kHz: 512-sample windows, each prefixed with the previous 64 samples.

    State per detector: the LSTM state [2, 1, 128] and the 64-sample context. Not thread-safe.
    """

    _WINDOW = 512
    _CONTEXT = 64

    def __init__(self, session: Any | None = None) -> None:
        self._session = session if session is not None else create_silero_session()
        self._sr = np.array(VAD_SAMPLE_RATE_HZ, dtype=np.int64)
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._input = np.zeros((1, self._CONTEXT + self._WINDOW), dtype=np.float32)  # [context | window]

    @property
    def window_num_samples(self) -> int:
        """512 samples (32 ms)."""
        return self._WINDOW

    def speech_prob(self, window: np.ndarray) -> float:
        """Speech probability of the next 512-sample float32 window."""
        if window.shape != (self._WINDOW,):
            raise ValueError(f"SileroVad needs windows of shape ({self._WINDOW},), got {window.shape}")
        self._input[0, self._CONTEXT :] = window
        prob, self._state = self._session.run(
            None, {"input": self._input, "state": self._state, "sr": self._sr}
        )
        # The model expects the last 64 samples of the previous window in front of the next one.
        self._input[0, : self._CONTEXT] = self._input[0, -self._CONTEXT :]
        return float(prob[0, 0])

    def reset(self) -> None:
        """Zero the LSTM state and the context."""
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._input[:] = 0.0


class WebRtcVad:
    """WebRTC GMM VAD on 30 ms windows (480 samples); probability is 0.0 or 1.0.

    `aggressiveness` 0 (least) .. 3 (most eager to call audio non-speech).
    """

    _WINDOW = 480

    def __init__(self, aggressiveness: int = 3) -> None:
        import webrtcvad

        if not 0 <= aggressiveness <= 3:
            raise ValueError(f"aggressiveness: must be 0..3, got {aggressiveness}")
        self._aggressiveness = aggressiveness
        self._vad = webrtcvad.Vad(aggressiveness)

    @property
    def window_num_samples(self) -> int:
        """480 samples (30 ms)."""
        return self._WINDOW

    def speech_prob(self, window: np.ndarray) -> float:
        """1.0 if the 30 ms window is classified as speech, else 0.0."""
        if window.shape != (self._WINDOW,):
            raise ValueError(f"WebRtcVad needs windows of shape ({self._WINDOW},), got {window.shape}")
        return 1.0 if self._vad.is_speech(float_to_pcm16(window), VAD_SAMPLE_RATE_HZ) else 0.0

    def reset(self) -> None:
        """Recreate the native detector (it keeps adaptive noise estimates)."""
        import webrtcvad

        self._vad = webrtcvad.Vad(self._aggressiveness)


def create_vad(kind: VadKind, *, silero_session: Any | None = None, webrtc_aggressiveness: int = 3) -> VadBackend:
    """Build a detector of `kind`; Silero reuses `silero_session` when given."""
    if kind is VadKind.SILERO:
        return SileroVad(silero_session)
    if kind is VadKind.WEBRTC:
        return WebRtcVad(webrtc_aggressiveness)
    raise ValueError(f"unknown VAD kind {kind!r}")
