"""Whisper log-mel constants and the Slaney mel filterbank, numpy only (no torch: the front-end processes' end-of-turn
model uses them without the engine's libraries).

The filterbank follows librosa `filters.mel` semantics (`norm="slaney"`), the source of whisper's `mel_filters.npz`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MEL_HOP_SAMPLES", "MEL_NUM_BINS", "MEL_N_FFT", "MEL_SAMPLE_RATE_HZ", "slaney_mel_filterbank"]

MEL_SAMPLE_RATE_HZ = 16000
MEL_N_FFT = 400
MEL_HOP_SAMPLES = 160
MEL_NUM_BINS = 128

# Slaney mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above (27 mels per 6.4×).
_SLANEY_HZ_PER_MEL = 200.0 / 3.0
_SLANEY_LOG_START_HZ = 1000.0
_SLANEY_LOG_START_MEL = _SLANEY_LOG_START_HZ / _SLANEY_HZ_PER_MEL
_SLANEY_LOG_STEP = np.log(6.4) / 27.0


def _hz_to_slaney_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / _SLANEY_HZ_PER_MEL
    log = _SLANEY_LOG_START_MEL + np.log(np.maximum(hz, 1e-300) / _SLANEY_LOG_START_HZ) / _SLANEY_LOG_STEP
    return np.where(hz >= _SLANEY_LOG_START_HZ, log, linear)


def _slaney_mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * _SLANEY_HZ_PER_MEL
    log = _SLANEY_LOG_START_HZ * np.exp(_SLANEY_LOG_STEP * (mel - _SLANEY_LOG_START_MEL))
    return np.where(mel >= _SLANEY_LOG_START_MEL, log, linear)


def slaney_mel_filterbank(
    sample_rate_hz: int = MEL_SAMPLE_RATE_HZ,
    n_fft: int = MEL_N_FFT,
    num_bins: int = MEL_NUM_BINS,
    f_min_hz: float = 0.0,
    f_max_hz: float | None = None,
) -> np.ndarray:
    """Triangular mel filters [num_bins, n_fft//2 + 1] float32, Slaney scale and area norm.

    Band edges are equally spaced in Slaney mels between f_min and f_max (default Nyquist);
    each triangle is scaled by 2 / (upper edge − lower edge) in Hz (librosa `norm="slaney"`).
    """
    f_max_hz = sample_rate_hz / 2 if f_max_hz is None else f_max_hz
    fft_hz = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate_hz)  # [n_fft//2 + 1]
    mel_edges = np.linspace(_hz_to_slaney_mel(f_min_hz), _hz_to_slaney_mel(f_max_hz), num_bins + 2)
    edges_hz = _slaney_mel_to_hz(mel_edges)  # [num_bins + 2]
    widths_hz = np.diff(edges_hz)
    offsets = edges_hz[:, None] - fft_hz[None, :]  # [num_bins + 2, n_freqs]
    rising = -offsets[:-2] / widths_hz[:-1, None]
    falling = offsets[2:] / widths_hz[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]
    return weights.astype(np.float32)
