"""Whisper log-mel frontend of Ming's audio encoder (docs/model.md §2.1, official `WhisperFrontend`).

float32 16 kHz waveform [n] → log-mel [⌊n/160⌋, 128] float32, computed as whisper's
`log_mel_spectrogram` without the 30 s padding. The 128-bin Slaney filterbank is built here
(librosa `filters.mel` semantics, the source of whisper's `mel_filters.npz`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "MEL_SAMPLE_RATE_HZ",
    "MEL_N_FFT",
    "MEL_HOP_SAMPLES",
    "MEL_NUM_BINS",
    "slaney_mel_filterbank",
    "log_mel_spectrogram",
    "wrap_clips",
    "num_mel_frames",
    "num_audio_tokens",
]

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


_FRONTEND: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # device -> (filters, window)


def _frontend(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    if device not in _FRONTEND:
        _FRONTEND[device] = (torch.from_numpy(slaney_mel_filterbank()).to(device),
                             torch.hann_window(MEL_N_FFT, periodic=True, dtype=torch.float32, device=device))
    return _FRONTEND[device]


def log_mel_spectrogram(waveform: np.ndarray | torch.Tensor, filters: torch.Tensor | None = None,
                        device: torch.device | str | None = None) -> torch.Tensor:
    """Whisper log-mel of one clip: float32 16 kHz [n] → [⌊n/160⌋, 128] float32.

    Periodic Hann 400, hop 160, centred STFT with reflect padding, last frame dropped, power
    spectrum, mel, log10(max(x, 1e-10)), floor at (clip max − 8), then (x + 4) / 4.
    `filters` ([128, 201] float32) overrides the Slaney filterbank (built once per device).
    `device` (default: the waveform's): where it is computed and returned. On CUDA a host waveform goes
    up from pinned memory and nothing waits for the GPU (serving: the engine thread's CPU stays free of
    FFT work and of contention with other threads for the CPU's cores).
    Raises ValueError for clips shorter than 201 samples (reflect padding needs n > 200).
    """
    wave = torch.as_tensor(waveform, dtype=torch.float32).reshape(-1)
    if wave.numel() <= MEL_N_FFT // 2:
        raise ValueError(f"audio clip too short for the mel frontend: {wave.numel()} samples")
    device = wave.device if device is None else torch.device(device)
    if device.type == "cuda" and not wave.is_cuda:
        wave = wave.pin_memory()
    wave = wave.to(device, non_blocking=True)
    default_filters, window = _frontend(device)
    filters = default_filters if filters is None else filters.to(device, torch.float32)
    stft = torch.stft(
        wave, MEL_N_FFT, MEL_HOP_SAMPLES, window=window, center=True, pad_mode="reflect", return_complex=True
    )  # [201, ⌊n/160⌋ + 1] complex64
    power = stft[:, :-1].abs() ** 2
    mel = filters @ power  # [128, T]
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).T.contiguous()


def wrap_clips(mels: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ming's "wrapped" multi-clip layout: clips [T_i, 128] → ([1, ΣT_i, 128], lengths [1, n_clips] int64)."""
    if not mels:
        raise ValueError("wrap_clips needs at least one clip")
    feats = torch.cat(list(mels), dim=0)[None]
    lengths = torch.tensor([[m.shape[0] for m in mels]], dtype=torch.int64)
    return feats, lengths


def num_mel_frames(num_samples: int) -> int:
    """Mel frames of a 16 kHz clip: ⌊n / 160⌋ (100 per second)."""
    return num_samples // MEL_HOP_SAMPLES


def num_audio_tokens(num_mel_frames: int) -> int:
    """Encoder output tokens for T mel frames: two stride-2 convs, (((T−1)//2 + 1) − 1)//2 + 1 (docs/model.md §2.3)."""
    encoder_frames = (num_mel_frames - 1) // 2 + 1
    return (encoder_frames - 1) // 2 + 1
