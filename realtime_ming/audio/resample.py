"""Sample-rate conversion: live (soxr streaming) and the model-input resampler of the reference.

`StreamResampler` converts a live float32 stream chunk by chunk; the concatenation of its outputs
plus `flush()` equals the one-shot `resample` bit for bit (same soxr filter, delay compensated).
`resample_torchaudio_compatible` reproduces `torchaudio.transforms.Resample` (docs/model.md §2.1,
§5.4) without importing torchaudio, so model inputs match the reference's features; it imports torch when
called (the live path, in the front-end processes, never loads torch).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import soxr

if TYPE_CHECKING:  # torch only where the model-input resampler runs: the live path (front ends) never loads it
    import torch

__all__ = [
    "LOW_LATENCY",
    "StreamResampler",
    "resample",
    "resampled_length",
    "resample_torchaudio_compatible",
]

_SOXR_QUALITY = "HQ"
# soxr's low quality (16-bit precision, ~96 dB): 24 kHz -> 16 kHz output lags the input by ~14 ms
# instead of HQ's ~37 ms. The live microphone path takes it: every ms of lag there delays the VAD's
# end-of-speech decision, hence the answer.
LOW_LATENCY = "LQ"


def resampled_length(num_samples: int, src_hz: int, dst_hz: int) -> int:
    """Output length of `resample` / a flushed `StreamResampler`: round-half-up(n · dst / src)."""
    return (2 * num_samples * dst_hz + src_hz) // (2 * src_hz)


def _check_rates(src_hz: int, dst_hz: int) -> None:
    if src_hz <= 0 or dst_hz <= 0:
        raise ValueError(f"sample rates must be positive, got src_hz={src_hz} dst_hz={dst_hz}")


def resample(samples: np.ndarray, src_hz: int, dst_hz: int, quality: str = _SOXR_QUALITY) -> np.ndarray:
    """One-shot soxr resampling of a mono float32 signal [n] → [resampled_length(n)]."""
    _check_rates(src_hz, dst_hz)
    x = np.ascontiguousarray(samples, dtype=np.float32)
    if src_hz == dst_hz:
        return x.copy()
    return soxr.resample(x, src_hz, dst_hz, quality=quality)


class StreamResampler:
    """Streaming mono float32 resampler with explicit `process(chunk)` / `flush()`.

    Output lags the input by the filter delay (~37 ms at HQ, ~14 at `LOW_LATENCY`, 24 -> 16 kHz); `flush()`
    returns the tail and makes the object ready for a new stream. Not thread-safe: one object per stream.
    """

    def __init__(self, src_hz: int, dst_hz: int, quality: str = _SOXR_QUALITY) -> None:
        _check_rates(src_hz, dst_hz)
        self.src_hz = src_hz
        self.dst_hz = dst_hz
        self._stream = (
            None
            if src_hz == dst_hz
            else soxr.ResampleStream(src_hz, dst_hz, 1, dtype="float32", quality=quality)
        )

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Feed float32 samples [n] at src_hz; returns the float32 samples ready at dst_hz."""
        x = np.ascontiguousarray(chunk, dtype=np.float32)
        if self._stream is None:
            return x.copy()
        return self._stream.resample_chunk(x)

    def flush(self) -> np.ndarray:
        """End of stream: returns the remaining output and resets for a new stream."""
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        tail = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        self._stream.clear()
        return tail

    def reset(self) -> None:
        """Drop any buffered input without producing output."""
        if self._stream is not None:
            self._stream.clear()


def _sinc_resample_kernel(
    orig: int, new: int, lowpass_filter_width: int, rolloff: float
) -> tuple[torch.Tensor, int]:
    """Polyphase windowed-sinc kernel [new, 1, 2·width + orig] for gcd-reduced rates.

    Same construction as torchaudio's `_get_sinc_resample_kernel` with `sinc_interp_hann`:
    built in float64, then cast to float32 (what `transforms.Resample` does with dtype=None).
    """
    import torch

    base_hz = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / base_hz)
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=torch.float64)[:, None, None] / new + idx
    t = (t * base_hz).clamp(-lowpass_filter_width, lowpass_filter_width)
    window = torch.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t)
    kernel = sinc * window * (base_hz / orig)
    return kernel.to(torch.float32), width


def resample_torchaudio_compatible(
    wave: torch.Tensor,
    src_hz: int,
    dst_hz: int,
    *,
    lowpass_filter_width: int = 6,
    rolloff: float = 0.99,
) -> torch.Tensor:
    """`torchaudio.transforms.Resample(src_hz, dst_hz)` defaults on a float tensor [..., n].

    Output [..., ceil(n · dst / src)] in the input's dtype. Rates are gcd-reduced; the input is
    zero-padded by `width` on the left and `width + orig` on the right, then convolved with
    stride `orig` (one output phase per kernel row).
    """
    import torch.nn.functional as F

    _check_rates(src_hz, dst_hz)
    if not wave.is_floating_point():
        raise TypeError(f"resample_torchaudio_compatible needs a float tensor, got {wave.dtype}")
    if src_hz == dst_hz:
        return wave
    gcd = math.gcd(src_hz, dst_hz)
    orig, new = src_hz // gcd, dst_hz // gcd
    kernel, width = _sinc_resample_kernel(orig, new, lowpass_filter_width, rolloff)
    shape = wave.shape
    x = wave.reshape(-1, shape[-1])  # [num_waves, n]
    num_waves, length = x.shape
    x = F.pad(x, (width, width + orig))
    out = F.conv1d(x[:, None], kernel.to(device=x.device, dtype=x.dtype), stride=orig)  # [nw, new, frames]
    out = out.transpose(1, 2).reshape(num_waves, -1)
    target_length = -(-new * length // orig)  # ceil
    return out[..., :target_length].reshape(*shape[:-1], -1)
