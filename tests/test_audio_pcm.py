"""PCM16 / G.711 / base64 codecs against CPython's audioop and the G.711 code tables."""

from __future__ import annotations

import base64
import warnings

import numpy as np
import pytest

from realtime_ming.audio.pcm import (
    AudioEncoding,
    AudioFormat,
    AudioFormatError,
    alaw_decode,
    alaw_encode,
    b64decode_audio,
    b64encode_audio,
    float_to_pcm16,
    pcm16_to_float,
    ulaw_decode,
    ulaw_encode,
)

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = np.arange(256, dtype=np.uint8)


def _audioop():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pytest.importorskip("audioop")  # stdlib up to Python 3.12


def test_ulaw_matches_audioop_for_every_value():
    """µ-law encode of all 65536 int16 values and decode of all 256 codes equal audioop's."""
    audioop = _audioop()
    pcm_bytes = ALL_INT16.astype("<i2").tobytes()
    assert ulaw_encode(ALL_INT16).tobytes() == audioop.lin2ulaw(pcm_bytes, 2)
    assert ulaw_decode(ALL_CODES).astype("<i2").tobytes() == audioop.ulaw2lin(ALL_CODES.tobytes(), 2)


def test_alaw_matches_audioop_for_every_value():
    """A-law encode of all 65536 int16 values and decode of all 256 codes equal audioop's."""
    audioop = _audioop()
    pcm_bytes = ALL_INT16.astype("<i2").tobytes()
    assert alaw_encode(ALL_INT16).tobytes() == audioop.lin2alaw(pcm_bytes, 2)
    assert alaw_decode(ALL_CODES).astype("<i2").tobytes() == audioop.alaw2lin(ALL_CODES.tobytes(), 2)


def test_g711_known_values():
    """G.711 table values: silence and both extremes encode/decode to the standard codes."""
    extremes = np.array([0, 32767, -32768], dtype=np.int16)
    assert ulaw_encode(extremes).tolist() == [0xFF, 0x80, 0x00]
    assert ulaw_decode(np.array([0xFF, 0x7F, 0x80, 0x00], dtype=np.uint8)).tolist() == [0, 0, 32124, -32124]
    assert alaw_encode(extremes).tolist() == [0xD5, 0xAA, 0x2A]
    assert alaw_decode(np.array([0xD5, 0x55, 0xAA, 0x2A], dtype=np.uint8)).tolist() == [8, -8, 32256, -32256]


def test_g711_codes_round_trip():
    """encode(decode(code)) == code for every A-law code and every µ-law code except 0x7F (−0 → +0)."""
    assert np.array_equal(alaw_encode(alaw_decode(ALL_CODES)), ALL_CODES)
    ulaw_back = ulaw_encode(ulaw_decode(ALL_CODES))
    assert np.flatnonzero(ulaw_back != ALL_CODES).tolist() == [0x7F]


def test_pcm16_round_trip_is_exact():
    """PCM16 bytes → float32 → bytes is the identity, and floats are int16 / 32768."""
    data = ALL_INT16.astype("<i2").tobytes()
    samples = pcm16_to_float(data)
    assert samples.dtype == np.float32
    assert samples[0] == -1.0 and samples[-1] == np.float32(32767 / 32768)
    assert float_to_pcm16(samples) == data


def test_float_to_pcm16_clips_out_of_range():
    """Values outside [-1, 1) clip to the int16 extremes instead of wrapping."""
    out = np.frombuffer(float_to_pcm16(np.array([2.0, -2.0, 1.0, 0.5], dtype=np.float32)), "<i2")
    assert out.tolist() == [32767, -32768, 32767, 16384]


def test_pcm16_odd_byte_count_raises():
    """An odd number of PCM16 bytes raises AudioFormatError."""
    with pytest.raises(AudioFormatError, match="even number of bytes, got 3"):
        pcm16_to_float(b"\x00\x01\x02")


def test_b64_round_trip_and_bad_input():
    """base64 helpers round-trip bytes; malformed text raises AudioFormatError."""
    data = bytes(range(256))
    text = b64encode_audio(data)
    assert text == base64.b64encode(data).decode("ascii")
    assert b64decode_audio(text) == data
    for bad in ("abc", "!!!!", "AAA=A"):
        with pytest.raises(AudioFormatError, match="invalid base64 audio"):
            b64decode_audio(bad)


def test_audio_format_validation():
    """G.711 formats accept only 8 kHz; partial samples raise AudioFormatError."""
    with pytest.raises(ValueError, match="sample_rate_hz: pcmu is 8000 Hz only"):
        AudioFormat(AudioEncoding.PCMU, 24000)
    with pytest.raises(ValueError, match="sample_rate_hz: must be positive"):
        AudioFormat(AudioEncoding.PCM16, 0)
    pcm = AudioFormat(AudioEncoding.PCM16, 24000)
    assert pcm.num_samples(4800) == 2400 and pcm.duration_ms(4800) == 100.0
    with pytest.raises(AudioFormatError):
        pcm.num_samples(4801)


@pytest.mark.parametrize("encoding", [AudioEncoding.PCMU, AudioEncoding.PCMA])
def test_audio_format_g711_decode_encode(encoding):
    """AudioFormat decodes every G.711 code to float and re-encodes it to the same code."""
    fmt = AudioFormat(encoding, 8000)
    codes = ALL_CODES[ALL_CODES != 0x7F] if encoding is AudioEncoding.PCMU else ALL_CODES
    samples = fmt.decode(codes.tobytes())
    assert samples.dtype == np.float32 and samples.shape == (codes.size,)
    assert fmt.encode(samples) == codes.tobytes()
