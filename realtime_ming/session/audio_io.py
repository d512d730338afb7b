"""The session's audio edges: wire input → 16 kHz model audio, 44.1 kHz engine audio → wire frames.

`InputDecoder` turns base64 appends in the session input format into 16 kHz float32 (streaming
resampler, so appends of any size give the same samples). `InputAudioBuffer` holds uncommitted
16 kHz input addressed by the session's sample clock. `OutputEncoder` resamples one response's
audio to the output format and cuts it into deltas of at most `frame_ms`, holding nothing back (a confirmed
speculative turn's held audio, released at once, goes out as one delta per segment: `engine/speculation.py`).
"""

from __future__ import annotations

import numpy as np

from ..audio import pcm
from ..audio.resample import LOW_LATENCY, StreamResampler, resample
from ..protocol.values import AudioEncoding, AudioFormat

__all__ = [
    "MODEL_SAMPLE_RATE_HZ",
    "InputAudioBuffer",
    "InputDecoder",
    "OutputEncoder",
    "encode_audio_once",
    "wire_duration_ms",
    "wire_format",
]

MODEL_SAMPLE_RATE_HZ = 16000  # Ming's audio encoder input rate (docs/model.md §2.1)

_ENCODINGS = {
    AudioEncoding.PCM: pcm.AudioEncoding.PCM16,
    AudioEncoding.PCMU: pcm.AudioEncoding.PCMU,
    AudioEncoding.PCMA: pcm.AudioEncoding.PCMA,
}


def wire_format(fmt: AudioFormat) -> pcm.AudioFormat:
    """The audio stage's codec for a protocol audio format."""
    return pcm.AudioFormat(_ENCODINGS[fmt.encoding], fmt.sample_rate_hz)


def wire_duration_ms(fmt: AudioFormat, b64_chars: int) -> float:
    """Approximate duration of a base64 payload of `b64_chars` characters in `fmt` (no decoding)."""
    codec = wire_format(fmt)
    num_bytes = b64_chars * 3 // 4
    return codec.duration_ms(num_bytes - num_bytes % codec.bytes_per_sample)


def encode_audio_once(samples_16k: np.ndarray, fmt: AudioFormat) -> str:
    """float32 16 kHz audio → base64 in `fmt` (for `conversation.item.retrieved`)."""
    codec = wire_format(fmt)
    return pcm.b64encode_audio(codec.encode(resample(samples_16k, MODEL_SAMPLE_RATE_HZ, codec.sample_rate_hz)))


class InputDecoder:
    """Streaming decode of `input_audio_buffer.append` payloads to 16 kHz float32."""

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt
        self._codec = wire_format(fmt)
        # low latency: the VAD (end of the user's turn) sees the microphone ~23 ms sooner than with HQ
        self._resampler = StreamResampler(self._codec.sample_rate_hz, MODEL_SAMPLE_RATE_HZ, LOW_LATENCY)

    def duration_ms(self, num_bytes: int) -> float:
        """Input duration of `num_bytes` of wire audio; raises pcm.AudioFormatError on a partial sample."""
        return self._codec.duration_ms(num_bytes)

    def decode(self, data: bytes) -> np.ndarray:
        """Wire bytes → float32 [m] at 16 kHz (m follows the resampler's delay)."""
        return self._resampler.process(self._codec.decode(data))

    def flush(self) -> np.ndarray:
        """End of an input stream (a commit): the samples the resampler still holds."""
        return self._resampler.flush()

    def reset(self) -> None:
        """Forget resampler history (after `input_audio_buffer.clear`)."""
        self._resampler.reset()


class InputAudioBuffer:
    """Uncommitted 16 kHz input. Sample indices are absolute on the session clock (samples
    appended since the session started), so VAD times map onto it directly."""

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []  # each [n] float32
        self._start = 0  # absolute index of the first buffered sample
        self._end = 0  # absolute index one past the last buffered sample

    @property
    def end_sample(self) -> int:
        """Absolute index one past the newest sample (the session clock)."""
        return self._end

    @property
    def num_samples(self) -> int:
        """Samples currently buffered."""
        return self._end - self._start

    def append(self, samples: np.ndarray) -> None:
        """Add float32 16 kHz samples at the end."""
        if samples.size:
            self._chunks.append(samples)
            self._end += samples.size

    def take(self, start: int, end: int) -> np.ndarray:
        """Copy of the samples in [start, end) (absolute, clamped to what is buffered)."""
        start, end = max(start, self._start), min(end, self._end)
        if end <= start:
            return np.zeros(0, dtype=np.float32)
        whole = np.concatenate(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
        return whole[start - self._start : end - self._start].copy()

    def drop_before(self, index: int) -> None:
        """Forget samples before absolute `index`."""
        index = min(max(index, self._start), self._end)
        while self._chunks and self._start + self._chunks[0].size <= index:
            self._start += self._chunks.pop(0).size
        if self._chunks and index > self._start:
            self._chunks[0] = self._chunks[0][index - self._start :]
            self._start = index

    def clear(self) -> None:
        """Forget everything; the clock keeps running."""
        self.drop_before(self._end)


class OutputEncoder:
    """One response's audio: float32 chunks at the engine rate → base64 deltas in `fmt`.

    Every `push` returns all audio that the resampler has produced, cut into deltas of at most
    `frame_ms` (the last may be shorter): nothing waits for a frame to fill.
    """

    def __init__(self, fmt: AudioFormat, src_rate_hz: int, frame_ms: int) -> None:
        self._codec = wire_format(fmt)
        self._resampler = StreamResampler(src_rate_hz, self._codec.sample_rate_hz)
        self._frame_samples = self._codec.sample_rate_hz * frame_ms // 1000
        self.num_samples = 0  # samples sent at the output rate
        self.audio = bytearray()  # everything sent, in the wire format (retrieve / truncate)

    @property
    def duration_ms(self) -> float:
        """Milliseconds of audio encoded so far."""
        return 1000.0 * self.num_samples / self._codec.sample_rate_hz

    @property
    def codec(self) -> pcm.AudioFormat:
        """The wire codec (encoding and rate) of the deltas."""
        return self._codec

    @property
    def frame_samples(self) -> int:
        """Samples of one full delta at the wire rate."""
        return self._frame_samples

    def resample(self, samples: np.ndarray) -> np.ndarray:
        """Engine audio [n] float32 → the wire rate (float32), not yet encoded nor counted as sent."""
        return self._resampler.process(samples)

    def encode(self, samples: np.ndarray, whole: bool = False) -> list[str]:
        """Wire-rate samples (from `resample`, in order) → base64 deltas ready to send, counted as sent (`whole`: all
        of it as one delta, for held audio released at once, which as frames would be a burst of events)."""
        return self._frames(samples, whole)

    def push(self, samples: np.ndarray, whole: bool = False) -> list[str]:
        """Feed engine audio [n] float32; returns base64 deltas ready to send (`resample` then `encode`)."""
        return self._frames(self._resampler.process(samples), whole)

    def flush(self) -> list[str]:
        """End of the response: the resampler's tail as deltas."""
        return self._frames(self._resampler.flush())

    def tail(self) -> np.ndarray:
        """End of the response's audio: the resampler's tail at the wire rate, not yet encoded (a later `flush`
        then has nothing left)."""
        return self._resampler.flush()

    def _frames(self, samples: np.ndarray, whole: bool = False) -> list[str]:
        deltas = []
        step = max(samples.size, 1) if whole else self._frame_samples
        for start in range(0, samples.size, step):
            data = self._codec.encode(samples[start : start + step])
            self.audio += data
            deltas.append(pcm.b64encode_audio(data))
        self.num_samples += samples.size
        return deltas
