"""`turn_detection.idle_timeout_ms` (GA): prompt the user when they stay silent after a reply.

OpenAI: the timeout starts when the last response's audio has finished playing (response.done plus
the audio's playback duration); when it passes without the user speaking, the server emits
`input_audio_buffer.timeout_triggered`, commits the silent input as a user item and creates a response
(the model prompts the user to go on). Here it runs on the input sample clock (ms of input audio
received), like the VAD: a client streaming its microphone in real time sees wall-clock behaviour, and
the session stays free of timers. A client that stops sending audio never times out.
"""

from __future__ import annotations

__all__ = ["IdleTimer"]


class IdleTimer:
    """One deadline on the input clock; fires once per arming."""

    def __init__(self) -> None:
        self._start_ms: int | None = None  # input position where the reply's playback ends
        self._deadline_ms: int | None = None

    def arm(self, position_ms: int, playback_ms: float, timeout_ms: int) -> None:
        """A response ended at input position `position_ms` with `playback_ms` of audio to play out."""
        self._start_ms = position_ms + round(playback_ms)
        self._deadline_ms = self._start_ms + timeout_ms

    def disarm(self) -> None:
        """The user spoke, committed, or a response started: nothing to wait for."""
        self._start_ms = self._deadline_ms = None

    def expired(self, position_ms: int) -> tuple[int, int] | None:
        """(audio_start_ms, audio_end_ms) of the idle stretch once `position_ms` passes the deadline (then disarmed)."""
        if self._deadline_ms is None or self._start_ms is None or position_ms < self._deadline_ms:
            return None
        span = (self._start_ms, position_ms)
        self.disarm()
        return span
