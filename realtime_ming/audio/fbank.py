"""Kaldi-compatible log-mel filterbank for the CAMPPlus speaker encoder (docs/model.md §5.4).

float32 16 kHz waveform [n] → mean-normalised fbank [frames, 80], the tensor the reference feeds
to `campplus.onnx` when registering a voice prompt. Reproduces `torchaudio.compliance.kaldi.fbank`
with Kaldi's default options and dither 0, without importing torchaudio.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "FBANK_SAMPLE_RATE_HZ",
    "FBANK_NUM_BINS",
    "kaldi_mel_banks",
    "kaldi_fbank",
    "speaker_fbank",
]

FBANK_SAMPLE_RATE_HZ = 16000
FBANK_NUM_BINS = 80

# Kaldi defaults (feature-window.h / mel-computations.h).
_FRAME_LENGTH_MS = 25.0
_FRAME_SHIFT_MS = 10.0
_PREEMPHASIS = 0.97
_POVEY_POWER = 0.85
_LOW_HZ = 20.0
_LOG_FLOOR = torch.finfo(torch.float32).eps


def _kaldi_mel(hz: np.ndarray | float) -> np.ndarray:
    """Kaldi/HTK mel scale: 1127 · ln(1 + f / 700)."""
    return 1127.0 * np.log(1.0 + np.asarray(hz, dtype=np.float64) / 700.0)


def kaldi_mel_banks(num_bins: int, padded_window: int, sample_rate_hz: int, low_hz: float, high_hz: float) -> np.ndarray:
    """Kaldi triangular mel banks [num_bins, padded_window//2 + 1] float32 (Nyquist column zero).

    Triangles are linear in mel with equally spaced edges between low_hz and high_hz (≤ 0 means
    Nyquist + high_hz); no area normalisation, as in Kaldi's `MelBanks`.
    """
    nyquist = 0.5 * sample_rate_hz
    if high_hz <= 0.0:
        high_hz += nyquist
    num_fft_bins = padded_window // 2
    mel_low, mel_high = _kaldi_mel(low_hz), _kaldi_mel(high_hz)
    delta = (mel_high - mel_low) / (num_bins + 1)
    left = mel_low + np.arange(num_bins)[:, None] * delta  # [num_bins, 1]
    center = left + delta
    right = center + delta
    fft_mel = _kaldi_mel(np.arange(num_fft_bins) * sample_rate_hz / padded_window)[None, :]
    rising = (fft_mel - left) / (center - left)
    falling = (right - fft_mel) / (right - center)
    banks = np.maximum(0.0, np.minimum(rising, falling))
    return np.pad(banks, ((0, 0), (0, 1))).astype(np.float32)


def kaldi_fbank(
    waveform: np.ndarray | torch.Tensor,
    *,
    num_bins: int = FBANK_NUM_BINS,
    sample_rate_hz: int = FBANK_SAMPLE_RATE_HZ,
) -> torch.Tensor:
    """`kaldi.fbank(waveform, num_mel_bins=num_bins, dither=0)` → log mel energies [frames, num_bins].

    Frames: 25 ms windows every 10 ms with snip_edges (frames = 1 + (n − 400) // 160 at 16 kHz,
    0 when shorter than one window); per frame: DC removal, pre-emphasis 0.97 (first sample
    against itself), Povey window (Hann^0.85, symmetric), zero-pad to 512, |rfft|², mel banks
    (20 Hz .. Nyquist), ln(max(x, float32 eps)). The waveform is used as given (no ×32768).
    """
    wave = torch.as_tensor(waveform, dtype=torch.float32).reshape(-1)
    window_size = int(sample_rate_hz * _FRAME_LENGTH_MS / 1000.0)
    window_shift = int(sample_rate_hz * _FRAME_SHIFT_MS / 1000.0)
    padded = 1 << math.ceil(math.log2(window_size))
    if wave.numel() < window_size:
        return torch.zeros(0, num_bins, dtype=torch.float32)
    frames = wave.unfold(0, window_size, window_shift)  # [num_frames, window_size]
    frames = frames - frames.mean(dim=1, keepdim=True)
    previous = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
    frames = frames - _PREEMPHASIS * previous
    window = torch.hann_window(window_size, periodic=False, dtype=torch.float32).pow(_POVEY_POWER)
    frames = F.pad(frames * window, (0, padded - window_size))  # [num_frames, padded]
    power = torch.fft.rfft(frames).abs().pow(2.0)  # [num_frames, padded//2 + 1]
    banks = torch.from_numpy(kaldi_mel_banks(num_bins, padded, sample_rate_hz, _LOW_HZ, 0.0))
    energies = power @ banks.T
    return torch.clamp(energies, min=_LOG_FLOOR).log()


def speaker_fbank(waveform_16k: np.ndarray | torch.Tensor) -> torch.Tensor:
    """CAMPPlus input: kaldi fbank (80 bins) minus its per-bin mean over time → [1, frames, 80]."""
    feats = kaldi_fbank(waveform_16k)
    return (feats - feats.mean(dim=0, keepdim=True))[None]
