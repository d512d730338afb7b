"""Input noise reduction: WebRTC's audio processing (noise suppression, high-pass, AGC) on the 16 kHz input.

Runs before VAD, the buffer and the encoder, on 10 ms frames (160 samples) through the `webrtc-noise-gain`
wheel (Home Assistant's binding of webrtc-audio-processing; a declared dependency on Linux x86_64 and
arm64). `near_field` (headsets) suppresses noise; `far_field` (laptop or room microphones) also runs the
automatic gain control, since a distant talker arrives quieter. `strength` 0-1 picks the suppression level
(0 = none, only the high-pass filter; 1 = WebRTC's "very high"). The output lags by less than one frame.
One processor per session; measured cost: `bench/denoise_bench.py`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["AUTO_GAIN_DBFS", "Denoiser", "DenoiserUnavailable", "suppression_level"]

_RATE_HZ = 16000
_FRAME = 160  # 10 ms at 16 kHz, the only frame the processor takes
_MAX_LEVEL = 4  # the binding's levels: 0 off, 1-4 = WebRTC low, moderate, high, very high
AUTO_GAIN_DBFS = 3  # the AGC's target level (dB below full scale) for far-field microphones
_PCM_SCALE = 32768.0


class DenoiserUnavailable(RuntimeError):
    """The WebRTC audio processing library is not installed (it has wheels for Linux only)."""


def suppression_level(strength: float) -> int:
    """The WebRTC noise suppression level (0-4) for an OpenAI `strength` in [0, 1]."""
    return round(min(max(strength, 0.0), 1.0) * _MAX_LEVEL)


def _processor_class() -> type:
    try:
        from webrtc_noise_gain import AudioProcessor
    except ImportError as exc:
        raise DenoiserUnavailable(
            f"the webrtc-noise-gain package is not installed ({exc}); it ships for Linux x86_64 and arm64") from exc
    return AudioProcessor


class Denoiser:
    """Streaming denoiser: float32 16 kHz chunks in, denoised float32 16 kHz out (not thread-safe).

    `level` is `suppression_level(strength)`; `auto_gain` turns on the AGC (far field). Raises
    `DenoiserUnavailable` when the library is missing.
    """

    def __init__(self, level: int, *, auto_gain: bool) -> None:
        if not 0 <= level <= _MAX_LEVEL:
            raise ValueError(f"level must be in [0, {_MAX_LEVEL}], got {level}")
        self._args = (AUTO_GAIN_DBFS if auto_gain else 0, level)
        self._processor = _processor_class()(*self._args)
        self._pending = np.zeros(0, dtype=np.int16)  # samples short of a frame

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Denoise the next 16 kHz samples; returns the whole 10 ms frames that are ready."""
        pcm = (np.clip(np.asarray(chunk, dtype=np.float32), -1.0, 32767 / _PCM_SCALE) * _PCM_SCALE).astype(np.int16)
        buf = np.concatenate([self._pending, pcm]) if self._pending.size else pcm
        n = buf.size - buf.size % _FRAME
        self._pending = buf[n:].copy()
        if not n:
            return np.zeros(0, dtype=np.float32)
        data = buf[:n].astype("<i2").tobytes()
        step = 2 * _FRAME
        out = b"".join(self._processor.Process10ms(data[i: i + step]).audio for i in range(0, len(data), step))
        return np.frombuffer(out, dtype="<i2").astype(np.float32) / _PCM_SCALE

    def flush(self) -> np.ndarray:
        """End of stream: the held samples, denoised (padded to a frame, cut back); the state carries on."""
        n = self._pending.size
        if not n:
            return np.zeros(0, dtype=np.float32)
        tail = np.pad(self._pending, (0, _FRAME - n)).astype(np.float32) / _PCM_SCALE
        self._pending = np.zeros(0, dtype=np.int16)
        return self.process(tail)[:n]

    def reset(self) -> None:
        """Drop all state (a cleared buffer): a fresh processor, nothing held."""
        self._processor = _processor_class()(*self._args)
        self._pending = np.zeros(0, dtype=np.int16)
