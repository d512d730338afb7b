"""The reply's output between the engine and the wire: paced to the listener, held while a barge-in is judged.

Every engine event of the default conversation's response waits in `OutputGate` until it may go out
(`playout.Playout.pump` applies it then), in arrival order:

* Pacing (`realtime_ming.output_lead_ms`, default 150): audio goes out only while the client holds less
  than that much unplayed audio (the session's `PlaybackClock`), so whatever the engine's speed the
  listener is never more than the lead ahead of what the server decides now. Engine audio is resampled to
  the wire rate as it comes (`WireAudio`) and cut into `output_frame_ms` pieces, so what a piece adds to the
  client's buffer is known exactly; the events after a piece wait behind it (a transcript stays with its
  audio, `response.done` follows the last delta). Unpaced (`null`), events go out as they come.
* The hold: telling a real interruption from a backchannel takes up to `barge_in_min_speech_ms` of speech
  (see `audio.turns.TurnDetector`). The moment the guarded detector hears a speech candidate, nothing
  more goes out; the client plays out what it holds (at most the lead) and falls silent. When the
  candidate is judged:

  - a real interruption (`speech_started`): the response is cancelled; the waiting events are dropped, so
    the item's audio is exactly what was sent and truncation works on it unchanged;
  - a backchannel, a cough, noise (the candidate is dropped): the output resumes where it stopped, in order:
    the listener hears a pause, nothing lost and nothing repeated.

The hold never outlives its candidate: `OutputGate.sync` releases it whenever the detector is no longer
judging one (turn started or dropped, buffer cleared or committed, detection reconfigured, the response
gone) and once `max_hold_s` of wall-clock time have passed (`playout.Playout.deadline` wakes the session
then, so a client that stops streaming mid-candidate cannot freeze a reply). It also ends once the candidate's
one word is over (`TurnDetector.barge_in_word_over`) and the listener has heard `max_pause_s` of silence (from
when the client ran out of audio): a backchannel's hold lasts its length plus `barge_in_max_gap_ms`, and the
longest ("mm-hmm") would pause the reply for more than 800 ms. The candidate itself stays open, so a second word
still interrupts; the listener then hears the reply resume briefly before it stops.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ..audio.config import TurnDetectorConfig
from ..engine.api import TurnEvent

__all__ = ["OutputGate", "WireAudio", "max_hold_s", "max_pause_s"]


@dataclass(frozen=True, slots=True)
class WireAudio:
    """A response's audio already at the wire rate (float32), waiting to be encoded and sent."""

    turn_id: str
    samples: np.ndarray
    whole: bool = False  # one delta (a confirmed speculation's backlog), not frames


Waiting = TurnEvent | WireAudio


def max_hold_s(config: TurnDetectorConfig) -> float:
    """Wall-clock bound of a hold: the longest a guarded candidate can last in input audio
    (`barge_in_min_speech_ms` of speech plus a `barge_in_max_gap_ms` gap), twice over for input
    that arrives at half real time."""
    return 2.0 * (config.barge_in_min_speech_ms + config.barge_in_max_gap_ms) / 1000.0


def max_pause_s(config: TurnDetectorConfig) -> float:
    """The longest silence a hold makes the listener hear once the candidate's one word is over."""
    return config.barge_in_max_pause_ms / 1000.0


class OutputGate:
    """Engine events of the default conversation's response waiting to go out (not thread-safe)."""

    def __init__(self, max_hold_s: float, max_pause_s: float | None = None) -> None:
        """`max_pause_s`: a hold ends after the listener heard this much silence once the candidate's word is over
        (`sync`); None: only when the candidate is judged or after `max_hold_s`."""
        if max_hold_s <= 0:
            raise ValueError(f"max_hold_s: must be > 0, got {max_hold_s}")
        if max_pause_s is not None and max_pause_s < 0:
            raise ValueError(f"max_pause_s: must be >= 0, got {max_pause_s}")
        self.max_hold_s = max_hold_s
        self.max_pause_s = max_pause_s
        self._events: deque[Waiting] = deque()
        self.turn_id: str | None = None  # the held turn, None when not holding
        self.since: float | None = None  # monotonic time the hold began
        self._spent = False  # the current candidate already had its hold
        self.holds_total = 0  # holds begun (observability / tests)

    # ---- the queue ---------------------------------------------------------------------------------------
    def put(self, event: TurnEvent) -> None:
        """Queue one engine event (in arrival order)."""
        self._events.append(event)

    def put_audio(self, turn_id: str, samples: np.ndarray, piece: int | None, whole: bool = False) -> None:
        """Queue wire-rate audio: in pieces of `piece` samples (paced), or as it is (None)."""
        if not samples.size:
            return
        if piece is None or whole:
            self._events.append(WireAudio(turn_id, samples, whole))
            return
        for start in range(0, samples.size, piece):
            self._events.append(WireAudio(turn_id, samples[start: start + piece]))

    def peek(self) -> Waiting | None:
        """The next event to go out, if any."""
        return self._events[0] if self._events else None

    def pop(self) -> Waiting:
        return self._events.popleft()

    def take_all(self) -> list[Waiting]:
        """Every waiting event, in order (the queue is left empty)."""
        events = list(self._events)
        self._events.clear()
        return events

    def drop(self, turn_id: str) -> None:
        """Forget the waiting events of `turn_id` (its response ended: they never go out)."""
        if any(e.turn_id == turn_id for e in self._events):
            self._events = deque(e for e in self._events if e.turn_id != turn_id)

    def __len__(self) -> int:
        return len(self._events)

    # ---- the hold ----------------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Holding a turn's events now."""
        return self.turn_id is not None

    def holds(self, turn_id: str) -> bool:
        """Events of `turn_id` must be kept back."""
        return self.turn_id is not None and self.turn_id == turn_id

    def pause_ends_at(self, word_over: bool, silent_since: float | None) -> float | None:
        """When the hold ends by the pause bound: the candidate's word is over and the listener has heard no reply
        audio since `silent_since` (None: it still plays, or the bound is off)."""
        if self.turn_id is None or not word_over or silent_since is None or self.max_pause_s is None:
            return None
        return silent_since + self.max_pause_s

    def sync(self, candidate: bool, turn_id: str | None, now: float, word_over: bool = False,
             silent_since: float | None = None) -> bool:
        """Follow the detector: hold `turn_id` while `candidate` (a guarded speech candidate is being
        judged while response `turn_id` plays), else end the hold. One candidate is held at most
        once: after `max_hold_s`, once its word is over (`word_over`) and the listener has been without audio since
        `silent_since` for `max_pause_s`, or when its response changes, it plays on until the detector decides.
        Returns whether a hold ended now (its events may go out)."""
        if not candidate:
            self._spent = False
        if self.turn_id is not None:
            expired = self.since is not None and now - self.since >= self.max_hold_s
            pause_end = self.pause_ends_at(word_over, silent_since)
            if candidate and turn_id == self.turn_id and not expired and (pause_end is None or now < pause_end):
                return False
            self.turn_id, self.since = None, None
            return True
        if candidate and turn_id is not None and not self._spent:
            self.turn_id, self.since, self._spent = turn_id, now, True
            self.holds_total += 1
        return False
