"""The audio of a WebRTC call as aiortc sees it: the output track, paced by the media clock, and the mic reader.

`OutputTrack.recv` is what aiortc's RTP sender awaits for each frame it Opus-encodes: it returns one 20 ms
frame of the call's `Playout` when that frame is due on the 48 kHz media clock (real time), so a frame is
"played" when it leaves and the playout holds exactly the unplayed lead. A loop that fell behind does not
catch up in a burst (a burst would only fill the browser's jitter buffer): the clock moves on instead.

`read_mic(track, sink)` decodes the client's track (aiortc decodes Opus) into 48 kHz mono float32 chunks.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Awaitable, Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from ..audio.pcm import int16_to_float
from .playout import FRAME_SAMPLES, RATE_HZ, Playout, PlayoutEvent

__all__ = ["MAX_LATE_S", "OutputTrack", "audio_frame", "read_mic"]

MAX_LATE_S = 0.1  # a frame due longer ago than this moves the clock on instead of going out in a burst
_TIME_BASE = fractions.Fraction(1, RATE_HZ)


class OutputTrack(MediaStreamTrack):
    """The server's audio track of one call: the playout's frames at real time; `on_events` gets the
    `output_audio_buffer.*` events each frame causes (called on the event loop)."""

    kind = "audio"

    def __init__(self, playout: Playout, on_events: Callable[[list[PlayoutEvent]], None]) -> None:
        super().__init__()
        self._playout = playout
        self._on_events = on_events
        self._start: float | None = None  # monotonic time of sample 0 on the media clock
        self._pts = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            self._pts += FRAME_SAMPLES
            due = self._start + self._pts / RATE_HZ
            if due > now:
                await asyncio.sleep(due - now)
            elif now - due > MAX_LATE_S:
                self._start = now - self._pts / RATE_HZ
        samples, events = self._playout.pull()
        if events:
            self._on_events(events)
        return audio_frame(samples, self._pts)


def audio_frame(samples: np.ndarray, pts: int) -> av.AudioFrame:
    """int16 mono samples at 48 kHz as the frame aiortc encodes, stamped `pts` (in samples)."""
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = RATE_HZ
    frame.pts = pts
    frame.time_base = _TIME_BASE
    return frame


async def read_mic(track: MediaStreamTrack, sink: Callable[[np.ndarray], Awaitable[None]]) -> None:
    """Feed the client's audio to `sink` as 48 kHz mono float32 chunks until the track ends."""
    resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE_HZ)
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        for out in resampler.resample(frame):
            await sink(int16_to_float(out.to_ndarray().reshape(-1)))
