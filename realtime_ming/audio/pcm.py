"""Wire audio codecs: PCM16 little-endian, G.711 µ-law / A-law, base64.

Bytes in, float32 numpy in [-1, 1) out and back. Everything here is a pure function; the G.711
tables are read-only arrays computed once from the ITU-T G.711 segment rules (the classic
Sun `g711.c` formulation, bit-identical to CPython's `audioop.lin2ulaw` / `lin2alaw`).
"""

from __future__ import annotations

import base64
import binascii
import enum
from dataclasses import dataclass

import numpy as np

__all__ = [
    "AudioFormatError",
    "AudioEncoding",
    "AudioFormat",
    "G711_SAMPLE_RATE_HZ",
    "pcm16_to_float",
    "float_to_pcm16",
    "int16_to_float",
    "float_to_int16",
    "ulaw_encode",
    "ulaw_decode",
    "alaw_encode",
    "alaw_decode",
    "b64encode_audio",
    "b64decode_audio",
]

G711_SAMPLE_RATE_HZ = 8000
_PCM16_SCALE = 32768.0


class AudioFormatError(ValueError):
    """Audio bytes that cannot be decoded: odd PCM16 byte count, invalid base64, bad format."""


class AudioEncoding(str, enum.Enum):
    """Sample encodings of the Realtime wire (`audio/pcm`, `audio/pcmu`, `audio/pcma`)."""

    PCM16 = "pcm16"
    PCMU = "pcmu"
    PCMA = "pcma"


@dataclass(slots=True, frozen=True)
class AudioFormat:
    """An encoding plus its sample rate; G.711 is always 8 kHz."""

    encoding: AudioEncoding
    sample_rate_hz: int

    def __post_init__(self) -> None:
        if not isinstance(self.encoding, AudioEncoding):
            raise ValueError(f"encoding: expected AudioEncoding, got {self.encoding!r}")
        if self.sample_rate_hz <= 0:
            raise ValueError(f"sample_rate_hz: must be positive, got {self.sample_rate_hz}")
        if self.encoding is not AudioEncoding.PCM16 and self.sample_rate_hz != G711_SAMPLE_RATE_HZ:
            raise ValueError(
                f"sample_rate_hz: {self.encoding.value} is {G711_SAMPLE_RATE_HZ} Hz only, "
                f"got {self.sample_rate_hz}"
            )

    @property
    def bytes_per_sample(self) -> int:
        """2 for PCM16, 1 for G.711."""
        return 2 if self.encoding is AudioEncoding.PCM16 else 1

    def num_samples(self, num_bytes: int) -> int:
        """Samples in `num_bytes` of this format; raises AudioFormatError on a partial sample."""
        if num_bytes % self.bytes_per_sample:
            raise AudioFormatError(
                f"{num_bytes} bytes is not a whole number of {self.encoding.value} samples"
            )
        return num_bytes // self.bytes_per_sample

    def duration_ms(self, num_bytes: int) -> float:
        """Duration in milliseconds of `num_bytes` of this format."""
        return 1000.0 * self.num_samples(num_bytes) / self.sample_rate_hz

    def decode(self, data: bytes) -> np.ndarray:
        """Wire bytes → float32 samples [n] in [-1, 1)."""
        if self.encoding is AudioEncoding.PCM16:
            return pcm16_to_float(data)
        codes = np.frombuffer(data, dtype=np.uint8)
        pcm = ulaw_decode(codes) if self.encoding is AudioEncoding.PCMU else alaw_decode(codes)
        return int16_to_float(pcm)

    def encode(self, samples: np.ndarray) -> bytes:
        """float32 samples [n] → wire bytes (values outside [-1, 1) are clipped)."""
        if self.encoding is AudioEncoding.PCM16:
            return float_to_pcm16(samples)
        pcm = float_to_int16(samples)
        codes = ulaw_encode(pcm) if self.encoding is AudioEncoding.PCMU else alaw_encode(pcm)
        return codes.tobytes()


def int16_to_float(pcm: np.ndarray) -> np.ndarray:
    """int16 samples → float32 = pcm / 32768."""
    return (np.asarray(pcm, dtype=np.int16).astype(np.float32)) / np.float32(_PCM16_SCALE)


def float_to_int16(samples: np.ndarray) -> np.ndarray:
    """float samples → int16 = round(x · 32768) clipped to [-32768, 32767] (exact inverse of int16_to_float)."""
    scaled = np.rint(np.asarray(samples, dtype=np.float32) * np.float32(_PCM16_SCALE))
    return np.clip(scaled, -32768, 32767).astype(np.int16)


def pcm16_to_float(data: bytes) -> np.ndarray:
    """PCM16 little-endian bytes → float32 [n]; raises AudioFormatError on an odd byte count."""
    if len(data) % 2:
        raise AudioFormatError(f"PCM16 needs an even number of bytes, got {len(data)}")
    return int16_to_float(np.frombuffer(data, dtype="<i2"))


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """float32 [n] → PCM16 little-endian bytes."""
    return float_to_int16(samples).astype("<i2").tobytes()


def b64encode_audio(data: bytes) -> str:
    """Audio bytes → base64 text as sent in `*.audio.delta` events."""
    return base64.b64encode(data).decode("ascii")


def b64decode_audio(text: str) -> bytes:
    """Base64 text from `input_audio_buffer.append` → bytes; raises AudioFormatError when malformed."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AudioFormatError(f"invalid base64 audio: {exc}") from exc


def _segment(values: np.ndarray, seg_ends: np.ndarray) -> np.ndarray:
    """Index of the first segment end ≥ value (8 when above the last segment)."""
    return np.searchsorted(seg_ends, values, side="left")


def _build_ulaw_encode_table() -> np.ndarray:
    # G.711 µ-law on the 14-bit magnitude: bias 33, clip 8159, 8 segments.
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 2
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(pcm), 8159) + 0x21
    seg = _segment(mag, np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF]))
    code = (seg << 4) | ((mag >> (seg + 1)) & 0xF)
    code = np.where(seg >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


def _build_ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _build_alaw_encode_table() -> np.ndarray:
    # G.711 A-law on the 13-bit value: even bits inverted (0x55), sign bit set for positives.
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 3
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    mag = np.where(pcm >= 0, pcm, -pcm - 1)
    seg = _segment(mag, np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF]))
    shift = np.where(seg < 2, 1, seg)
    code = (seg << 4) | ((mag >> np.minimum(shift, 8)) & 0xF)
    code = np.where(seg >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


def _build_alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


def _read_only(table: np.ndarray) -> np.ndarray:
    table.setflags(write=False)
    return table


_ULAW_ENCODE = _read_only(_build_ulaw_encode_table())  # [65536] uint8, index = pcm + 32768
_ULAW_DECODE = _read_only(_build_ulaw_decode_table())  # [256] int16
_ALAW_ENCODE = _read_only(_build_alaw_encode_table())  # [65536] uint8, index = pcm + 32768
_ALAW_DECODE = _read_only(_build_alaw_decode_table())  # [256] int16


def ulaw_encode(pcm: np.ndarray) -> np.ndarray:
    """int16 samples → µ-law codes (uint8)."""
    return _ULAW_ENCODE[np.asarray(pcm, dtype=np.int16).astype(np.int32) + 32768]


def ulaw_decode(codes: np.ndarray) -> np.ndarray:
    """µ-law codes (uint8) → int16 samples."""
    return _ULAW_DECODE[np.asarray(codes, dtype=np.uint8)]


def alaw_encode(pcm: np.ndarray) -> np.ndarray:
    """int16 samples → A-law codes (uint8)."""
    return _ALAW_ENCODE[np.asarray(pcm, dtype=np.int16).astype(np.int32) + 32768]


def alaw_decode(codes: np.ndarray) -> np.ndarray:
    """A-law codes (uint8) → int16 samples."""
    return _ALAW_DECODE[np.asarray(codes, dtype=np.uint8)]
