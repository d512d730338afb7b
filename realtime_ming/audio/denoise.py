"""Input noise reduction: RNNoise (Xiph, BSD-3) on the 16 kHz input stream, before VAD and the encoder.

The native library ships in the `pyrnnoise` wheel (`pip install --no-deps pyrnnoise`; its own Python
module needs audiolab/PyAV for file I/O, so it is never imported: the `.so` is loaded with ctypes).
RNNoise runs at 48 kHz on 480-sample frames: the stream goes up ×3, through RNNoise, and back down,
so its output lags the input by at most one frame plus the resamplers' delay. One state per session.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np

from realtime_ming.audio.resample import StreamResampler

__all__ = ["DenoiserUnavailable", "RnnoiseDenoiser", "rnnoise_library_path"]

_RATE_HZ = 16000
_RNNOISE_HZ = 48000
_FRAME = 480  # 10 ms at 48 kHz
_PCM_SCALE = 32768.0  # RNNoise works on float samples in the int16 range
_LIB: ctypes.CDLL | None = None


class DenoiserUnavailable(RuntimeError):
    """The RNNoise library is not installed."""


def rnnoise_library_path() -> Path:
    """`librnnoise.so` inside the installed `pyrnnoise` wheel; raises DenoiserUnavailable if missing."""
    spec = importlib.util.find_spec("pyrnnoise")
    if spec is None or not spec.submodule_search_locations:
        raise DenoiserUnavailable("package pyrnnoise is not installed (pip install --no-deps pyrnnoise)")
    for location in spec.submodule_search_locations:
        for name in ("librnnoise.so", "librnnoise.dylib", "rnnoise.dll"):
            if (Path(location) / name).is_file():
                return Path(location) / name
    raise DenoiserUnavailable("the RNNoise library is missing from the pyrnnoise package")


def _library() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        try:
            lib = ctypes.CDLL(str(rnnoise_library_path()))
        except OSError as exc:
            raise DenoiserUnavailable(f"cannot load RNNoise: {exc}") from exc
        lib.rnnoise_create.argtypes = [ctypes.c_void_p]
        lib.rnnoise_create.restype = ctypes.c_void_p
        lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
        lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                                              ctypes.POINTER(ctypes.c_float)]
        lib.rnnoise_process_frame.restype = ctypes.c_float
        lib.rnnoise_get_frame_size.restype = ctypes.c_int
        if lib.rnnoise_get_frame_size() != _FRAME:
            raise DenoiserUnavailable(f"unexpected RNNoise frame size {lib.rnnoise_get_frame_size()}")
        _LIB = lib
    return _LIB


class RnnoiseDenoiser:
    """Streaming denoiser: float32 16 kHz chunks in, denoised float32 16 kHz out (not thread-safe)."""

    def __init__(self) -> None:
        self._lib = _library()
        self._state = self._lib.rnnoise_create(None)
        self._up = StreamResampler(_RATE_HZ, _RNNOISE_HZ)
        self._down = StreamResampler(_RNNOISE_HZ, _RATE_HZ)
        self._pending = np.zeros(0, dtype=np.float32)  # 48 kHz samples short of a frame
        self._frame = np.zeros(_FRAME, dtype=np.float32)
        self._ptr = self._frame.ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    def __del__(self) -> None:
        state, self._state = getattr(self, "_state", None), None
        if state:
            self._lib.rnnoise_destroy(state)

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Denoise the next 16 kHz samples; returns the denoised samples that are ready."""
        return self._down.process(self._frames(self._up.process(np.asarray(chunk, dtype=np.float32))))

    def flush(self) -> np.ndarray:
        """End of stream: everything still held, denoised; the next chunk starts a new stream."""
        tail = np.concatenate([self._pending, self._up.flush()])
        n = tail.size
        self._pending = np.zeros(0, dtype=np.float32)
        out = self._frames(np.pad(tail, (0, -n % _FRAME)))[:n] if n else tail
        return np.concatenate([self._down.process(out), self._down.flush()])

    def reset(self) -> None:
        """Drop all state (a cleared buffer)."""
        self._lib.rnnoise_destroy(self._state)
        self._state = self._lib.rnnoise_create(None)
        self._up.flush()
        self._down.flush()
        self._pending = np.zeros(0, dtype=np.float32)

    def _frames(self, x48: np.ndarray) -> np.ndarray:
        buf = np.concatenate([self._pending, x48]) if self._pending.size else x48
        n = buf.size - buf.size % _FRAME
        out = np.empty(n, dtype=np.float32)
        for start in range(0, n, _FRAME):
            self._frame[:] = buf[start: start + _FRAME] * _PCM_SCALE
            self._lib.rnnoise_process_frame(self._state, self._ptr, self._ptr)
            out[start: start + _FRAME] = self._frame / _PCM_SCALE
        self._pending = buf[n:].copy()
        return out
