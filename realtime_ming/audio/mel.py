"""Whisper log-mel frontend of Ming's audio encoder (docs/model.md §2.1, official `WhisperFrontend`).

float32 16 kHz waveform [n] → log-mel [⌊n/160⌋, 128] float32, computed as whisper's
`log_mel_spectrogram` without the 30 s padding. The 128-bin Slaney filterbank is built here
(`audio/mel_filters.py`, librosa `filters.mel` semantics, the source of whisper's `mel_filters.npz`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .mel_filters import (
    MEL_HOP_SAMPLES,
    MEL_N_FFT,
    MEL_NUM_BINS,
    MEL_SAMPLE_RATE_HZ,
    slaney_mel_filterbank,
)

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
