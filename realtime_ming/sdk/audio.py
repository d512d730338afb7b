"""Audio on the SDK's edges: what `send_audio` accepts → wire bytes, audio deltas → float32, WAV files.

Input audio is mono float32 in [-1, 1] (or int16) at a known rate; it is resampled (soxr) to the
session's input rate and encoded in the session's input format (PCM16 or G.711). Output deltas
decode back to float32 at the response's output rate, which `save_wav` writes as 16-bit PCM.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeAlias

import numpy as np
import soundfile as sf

from ..audio import pcm
from ..audio.resample import resample
from ..protocol.values import AudioFormat
from ..session.audio_io import wire_format

__all__ = ["AudioInput", "decode_audio_deltas", "encode_input_audio", "read_audio_file", "save_wav"]

# bytes: already in the session's wire format; array: samples [n] or [n, channels];
# str / PathLike: any file soundfile reads (WAV, FLAC, OGG, …).
AudioInput: TypeAlias = bytes | bytearray | memoryview | np.ndarray | str | os.PathLike


def read_audio_file(path: str | os.PathLike, sample_rate_hz: int) -> np.ndarray:
    """Read a soundfile-readable file as mono float32 [n] at `sample_rate_hz` (channels averaged)."""
    data, file_rate_hz = sf.read(os.fspath(path), dtype="float32", always_2d=True)
    return resample(data.mean(axis=1), int(file_rate_hz), sample_rate_hz)


def _as_float_mono(samples: np.ndarray) -> np.ndarray:
    """float or int16 samples [n] / [n, channels] → float32 [n]."""
    array = np.asarray(samples)
    if array.dtype == np.int16:
        array = pcm.int16_to_float(array)
    elif not np.issubdtype(array.dtype, np.floating):
        raise TypeError(f"audio arrays must be float or int16, got {array.dtype}")
    if array.ndim == 2:
        array = array.mean(axis=1)
    elif array.ndim != 1:
        raise ValueError(f"audio arrays must be [n] or [n, channels], got shape {array.shape}")
    return np.ascontiguousarray(array, dtype=np.float32)


def encode_input_audio(audio: AudioInput, fmt: AudioFormat, sample_rate_hz: int | None = None) -> bytes:
    """Wire bytes of `audio` in the session input format `fmt`.

    Bytes pass through unchanged (they must hold whole samples of `fmt`). Arrays are at
    `sample_rate_hz` (default: the format's rate) and files at their own rate; both are resampled
    to the format's rate and encoded. Raises `ValueError` / `TypeError` for unusable input.
    """
    codec = wire_format(fmt)
    if isinstance(audio, bytes | bytearray | memoryview):
        data = bytes(audio)
        codec.num_samples(len(data))  # raises AudioFormatError (a ValueError) on a partial sample
        return data
    if isinstance(audio, np.ndarray):
        samples = resample(_as_float_mono(audio), sample_rate_hz or codec.sample_rate_hz, codec.sample_rate_hz)
    elif isinstance(audio, str | os.PathLike):
        samples = read_audio_file(audio, codec.sample_rate_hz)
    else:
        raise TypeError(f"unsupported audio input {type(audio).__name__}")
    return codec.encode(samples)


def decode_audio_deltas(deltas: list[str], fmt: AudioFormat) -> np.ndarray:
    """Concatenated base64 audio deltas in output format `fmt` → float32 [n] at `fmt.sample_rate_hz`."""
    codec = wire_format(fmt)
    data = b"".join(pcm.b64decode_audio(delta) for delta in deltas)
    return codec.decode(data).astype(np.float32, copy=False)


def save_wav(path: str | os.PathLike, audio: np.ndarray, sample_rate_hz: int) -> Path:
    """Write mono float32 `audio` as a 16-bit PCM WAV whose header says `sample_rate_hz`."""
    target = Path(path)
    # int16 in, so the file holds exactly the wire's rounding and clipping (float_to_int16).
    sf.write(target, pcm.float_to_int16(_as_float_mono(audio)), sample_rate_hz, subtype="PCM_16", format="WAV")
    return target
