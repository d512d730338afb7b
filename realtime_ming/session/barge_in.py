"""Barge-in output hold: the reply goes quiet at the first speech window, before the interruption is judged.

While a reply is generated, telling a real interruption from a backchannel takes up to
`barge_in_min_speech_ms` of speech (see `audio.turns.TurnDetector`). Cancelling only then lets the
reply stream on for that long. Instead, the moment the guarded detector hears a speech candidate the
session *holds* the engine events of the active response (nothing more is sent: no audio delta, no
transcript delta, no `.done`), and when the candidate is judged:

* a real interruption (`speech_started`): the response is cancelled as before; the held events are
  dropped, so the item's audio is exactly what was sent and truncation works on it unchanged;
* a backchannel, a cough, noise (the candidate is dropped): every held event is applied in order,
  so the client receives the full reply, nothing lost and nothing reordered.

The hold never outlives its candidate: `OutputHold.sync` releases it whenever the detector is no
longer judging one (turn started or dropped, buffer cleared or committed, detection reconfigured,
the response gone) and once `max_hold_s` of wall-clock time have passed, checked on every client and
engine event (a client that stops streaming mid-candidate cannot freeze a reply that is still being
generated; one whose engine turn already ended is released by the client's next event).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..audio.config import TurnDetectorConfig
from ..engine.api import TurnEvent
from . import lifecycle
from .actions import Action

if TYPE_CHECKING:
    from .session import Session

__all__ = ["OutputHold", "max_hold_s", "sync_output_hold"]


def max_hold_s(config: TurnDetectorConfig) -> float:
    """Wall-clock bound of a hold: the longest a guarded candidate can last in input audio
    (`barge_in_min_speech_ms` of speech plus a `barge_in_max_gap_ms` gap), twice over for input
    that arrives at half real time."""
    return 2.0 * (config.barge_in_min_speech_ms + config.barge_in_max_gap_ms) / 1000.0


def sync_output_hold(session: Session, now: float) -> list[Action]:
    """Start or end the session's output hold after its input moved; a release applies the held events."""
    response = session._response
    released = session._hold.sync(session._input.judging_barge_in, None if response is None else response.id, now)
    actions: list[Action] = []
    for event in released or ():
        actions += lifecycle.on_engine_event(session, event, now)
    return actions


class OutputHold:
    """Engine events of one turn kept back while a possible interruption is judged (not thread-safe)."""

    def __init__(self, max_hold_s: float) -> None:
        if max_hold_s <= 0:
            raise ValueError(f"max_hold_s: must be > 0, got {max_hold_s}")
        self.max_hold_s = max_hold_s
        self.turn_id: str | None = None  # the held turn, None when not holding
        self.since: float | None = None  # monotonic time the hold began
        self._events: list[TurnEvent] = []
        self._spent = False  # the current candidate already had its hold
        self.holds_total = 0  # holds begun (observability / tests)

    @property
    def active(self) -> bool:
        """Holding a turn's events now."""
        return self.turn_id is not None

    def holds(self, turn_id: str) -> bool:
        """Events of `turn_id` must be kept back."""
        return self.turn_id is not None and self.turn_id == turn_id

    def add(self, event: TurnEvent) -> None:
        """Keep one event of the held turn (in arrival order)."""
        assert self.holds(event.turn_id)
        self._events.append(event)

    def sync(self, candidate: bool, turn_id: str | None, now: float) -> list[TurnEvent] | None:
        """Follow the detector: hold `turn_id` while `candidate` (a guarded speech candidate is being
        judged for the active response `turn_id`), else end the hold. One candidate is held at most
        once: after `max_hold_s`, or when its response changes, it plays on until the detector decides.

        Returns the held events to apply now when a hold ends (in order; possibly empty), None when
        nothing is released.
        """
        if not candidate:
            self._spent = False
        if self.turn_id is not None:
            expired = self.since is not None and now - self.since >= self.max_hold_s
            if candidate and turn_id == self.turn_id and not expired:
                return None
            return self.release()
        if candidate and turn_id is not None and not self._spent:
            self.turn_id, self.since, self._spent = turn_id, now, True
            self.holds_total += 1
        return None

    def release(self) -> list[TurnEvent]:
        """End the hold: the held events, for the caller to apply in order (dropped ones: ignore them)."""
        events, self._events = self._events, []
        self.turn_id, self.since = None, None
        return events
