"""The server-side output audio buffer of a WebRTC call (sans-I/O): what was sent to the track, and when.

The session's audio deltas arrive far ahead of real time; the call's media track takes one 20 ms frame at a
time, at real time (`tracks.OutputTrack`), so what waits here is exactly the lead of unplayed audio and what
left is what the listener heard (give or take the network and the browser's jitter buffer). The playout
says so with the GA WebRTC events:

* `output_audio_buffer.started` when the first frame of a response's audio leaves;
* `output_audio_buffer.stopped` when a response has ended (`end`) and its last sample has left;
* `output_audio_buffer.cleared` when `clear` drops unplayed audio (a barge-in, `output_audio_buffer.clear`),
  with the play position of each item cut short, for the transport to truncate the conversation to it.

Audio of several responses (an out-of-band one beside the default conversation's) is played in arrival
order. A cleared response is muted: audio it still generates is dropped, never played.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..protocol.server_events import OutputAudioBufferCleared, OutputAudioBufferStarted, OutputAudioBufferStopped

__all__ = ["FRAME_SAMPLES", "RATE_HZ", "Cut", "Playout"]

RATE_HZ = 48000  # the WebRTC audio clock (Opus)
FRAME_SAMPLES = RATE_HZ // 50  # 20 ms

PlayoutEvent = OutputAudioBufferStarted | OutputAudioBufferStopped | OutputAudioBufferCleared


@dataclass(frozen=True, slots=True)
class Cut:
    """An item whose audio a clear cut short: it was heard up to `audio_end_ms`."""

    item_id: str
    audio_end_ms: int


@dataclass(slots=True)
class _Response:
    queued: int = 0  # samples waiting
    started: bool = False  # `started` sent
    ended: bool = False  # no more audio comes (`end`)
    muted: bool = False  # cleared: later audio is dropped
    items: list[str] = field(default_factory=list)


class Playout:
    """One call's playout queue at 48 kHz mono int16; all methods are called from the event loop."""

    def __init__(self) -> None:
        self._queue: deque[tuple[str, str, np.ndarray]] = deque()  # (response id, item id, samples)
        self._head = 0  # samples of the first chunk already played
        self._responses: dict[str, _Response] = {}
        self._played: dict[str, int] = {}  # item id -> samples played (48 kHz)
        self._last: str | None = None  # the response heard last (a clear names it when nothing plays)
        self.buffered = 0  # samples waiting, all responses

    @property
    def buffered_ms(self) -> float:
        """The lead of unplayed audio."""
        return 1000.0 * self.buffered / RATE_HZ

    def playing(self) -> bool:
        """Some response's audio is being played (started and not stopped or cleared)."""
        return any(r.started for r in self._responses.values())

    def played_ms(self, item_id: str) -> int:
        """Milliseconds of `item_id`'s audio that have left (0 for an unknown item)."""
        return self._played.get(item_id, 0) * 1000 // RATE_HZ

    def push(self, response_id: str, item_id: str, samples: np.ndarray) -> None:
        """Queue int16 samples of an item (dropped for a muted response)."""
        response = self._responses.setdefault(response_id, _Response())
        if response.muted or samples.size == 0:
            return
        if item_id not in response.items:
            response.items.append(item_id)
        self._queue.append((response_id, item_id, samples))
        response.queued += samples.size
        self.buffered += samples.size

    def end(self, response_id: str) -> list[PlayoutEvent]:
        """No more audio comes for the response: `stopped` now if its audio has all been played."""
        response = self._responses.get(response_id)
        if response is None:
            return []
        response.ended = True
        return self._finish(response_id, response)

    def pull(self) -> tuple[np.ndarray, list[PlayoutEvent]]:
        """The next 20 ms frame (silence where nothing waits) and the events it causes, in order."""
        frame = np.zeros(FRAME_SAMPLES, np.int16)
        events: list[PlayoutEvent] = []
        filled = 0
        while filled < FRAME_SAMPLES and self._queue:
            response_id, item_id, samples = self._queue[0]
            response = self._responses[response_id]
            if not response.started:
                response.started = True
                self._last = response_id
                events.append(OutputAudioBufferStarted(response_id=response_id))
            take = min(FRAME_SAMPLES - filled, samples.size - self._head)
            frame[filled : filled + take] = samples[self._head : self._head + take]
            filled += take
            self._head += take
            self._played[item_id] = self._played.get(item_id, 0) + take
            response.queued -= take
            self.buffered -= take
            if self._head == samples.size:
                self._queue.popleft()
                self._head = 0
                events += self._finish(response_id, response)
        return frame, events

    def clear(self, *, explicit: bool) -> tuple[list[PlayoutEvent], list[Cut]]:
        """Drop every unplayed sample and mute the responses they belonged to. Returns `cleared` for each response
        that was being played or had audio waiting (`explicit`, a client's `output_audio_buffer.clear`: for the
        last one heard when none was), and the cut of each of their items not heard to the end."""
        affected = [rid for rid, r in self._responses.items() if r.queued or (r.started and not r.ended)]
        self._queue.clear()
        self._head = 0
        self.buffered = 0
        events: list[PlayoutEvent] = []
        if not affected and explicit and self._last is not None:  # nothing plays: name the last one heard
            events.append(OutputAudioBufferCleared(response_id=self._last))
        cuts: list[Cut] = []
        for response_id in affected:
            response = self._responses[response_id]
            cuts += [Cut(item, self.played_ms(item)) for item in response.items]
            response.queued, response.started, response.muted = 0, False, True
            events.append(OutputAudioBufferCleared(response_id=response_id))
            if response.ended:
                self._forget(response_id)
        return events, cuts

    def _finish(self, response_id: str, response: _Response) -> list[PlayoutEvent]:
        if not response.ended or response.queued:
            return []
        self._forget(response_id)
        return [OutputAudioBufferStopped(response_id=response_id)] if response.started else []

    def _forget(self, response_id: str) -> None:
        response = self._responses.pop(response_id, None)
        if response is not None:
            for item in response.items:
                self._played.pop(item, None)
