"""What the listener hears: the playback clock of one spoken response (docs/barge_in.md).

A standard Realtime client (the browser demo, openai-agents, pipecat) plays every `response.output_audio.delta` in
order at real time from the moment it arrives, never before the end of the one before, and stops playing when it
receives `input_audio_buffer.speech_started`. `PlaybackClock` follows that model from the server's side: a delta
sent at `now` plays from max(now, the end of what was sent before), so at any time the clock knows the position the
client has played (`position_ms`) and how much unplayed audio it holds (`lead_ms`). What the client tells corrects
it: `conversation.item.truncate` (it stopped at `audio_end_ms`), `output_audio_buffer.clear` and an interruption's
`speech_started` (it stopped now); after `response.cancel` no more audio is sent, and what was sent plays out.

The barge-in guard, the output hold and the pacing of a reply's audio follow this clock, not generation: a reply
generated in a second plays for many more, and for all of that time the user is listening to it.
Times are monotonic seconds, durations milliseconds.
"""

from __future__ import annotations

__all__ = ["Playback", "PlaybackClock"]


class PlaybackClock:
    """The client-side playback of one response's audio, as the server can know it (not thread-safe)."""

    def __init__(self, response_id: str, item_id: str, *, start_at: float = 0.0) -> None:
        """`start_at`: when the audio before this response (an earlier reply still playing) ends at the client."""
        self.response_id = response_id
        self.item_id = item_id
        self.first_at: float | None = None  # when the first delta went out
        self.sent_ms = 0.0  # audio sent so far
        self._end_at = start_at  # when the client will have played everything sent
        self._stopped_ms: float | None = None  # where the client stopped playing (None: it plays on)
        self.done = False  # the response ended: no more audio comes
        self.started_told = False  # `output_audio_buffer.started` went out (where the session sends those events)
        self.end_told = False  # `.stopped` or `.cleared` went out

    @property
    def end_at(self) -> float:
        """When the client will have played everything sent (in the past once it has)."""
        return self._end_at

    @property
    def stopped(self) -> bool:
        """The client stopped playing this response's audio (flushed, cleared or truncated it)."""
        return self._stopped_ms is not None

    def sent(self, ms: float, now: float) -> None:
        """`ms` of audio went out at `now`. Audio sent after a stop plays from its arrival (a client that
        flushed its buffer plays what comes next)."""
        if ms <= 0:
            return
        if self.first_at is None:
            self.first_at = now
        if self._stopped_ms is not None:
            self._stopped_ms, self._end_at = None, now
        self._end_at = max(self._end_at, now) + ms / 1000.0
        self.sent_ms += ms

    def lead_ms(self, now: float) -> float:
        """Unplayed audio the client holds at `now` (0 once stopped or played out)."""
        if self._stopped_ms is not None:
            return 0.0
        return min(self.sent_ms, max(0.0, (self._end_at - now) * 1000.0))

    def position_ms(self, now: float) -> float:
        """The position in the response's audio the client has played up to at `now`."""
        if self._stopped_ms is not None:
            return self._stopped_ms
        return self.sent_ms - self.lead_ms(now)

    def playing(self, now: float) -> bool:
        """The listener hears this response at `now`."""
        return self._stopped_ms is None and self.sent_ms > 0 and self._end_at > now

    def stop(self, now: float, at_ms: float | None = None) -> float:
        """The client stopped playing at `now` (at `at_ms` of the audio when it says so): returns the position."""
        position = self.position_ms(now) if at_ms is None else min(float(at_ms), self.sent_ms)
        self._stopped_ms = position
        self._end_at = min(self._end_at, now)
        return position


class Playback:
    """The playback clocks of a session's spoken responses that still matter: each one still playing or with an
    `output_audio_buffer` event to come, and always the latest."""

    def __init__(self) -> None:
        self.clocks: list[PlaybackClock] = []

    @property
    def latest(self) -> PlaybackClock | None:
        """The clock of the latest spoken response, if any."""
        return self.clocks[-1] if self.clocks else None

    def playing(self, now: float) -> bool:
        """Some response's audio is heard at `now`."""
        return any(c.playing(now) for c in self.clocks)

    def start(self, response_id: str, item_id: str, now: float, *, events: bool) -> PlaybackClock:
        """The clock of a new spoken response: its audio plays after what the client still holds of the ones
        before. `events`: the session sends `output_audio_buffer.*` (a clock is kept until they are told)."""
        latest = self.latest
        start_at = latest.end_at if latest is not None and latest.playing(now) else now
        clock = PlaybackClock(response_id, item_id, start_at=start_at)
        self.clocks = [c for c in self.clocks if not _settled(c, now, events)] + [clock]
        return clock


def _settled(clock: PlaybackClock, now: float, events: bool) -> bool:
    """Nothing more happens to `clock`: no audio plays and no event is left to tell."""
    told = clock.end_told or not (events and clock.started_told)
    return clock.done and told and not clock.playing(now)
