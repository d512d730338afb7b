"""What the listener hears, on the Sans-I/O session with a virtual clock (energy VAD, 16 kHz input).

A standard client plays every audio delta in order at real time from its arrival and flushes on speech_started
(`Listener` below). Paced output keeps what it holds within `output_lead_ms`; the barge-in guard and the hold follow
its playback, not generation; the client's truncate and `output_audio_buffer.clear` correct the clock; the
`output_audio_buffer.*` events go to a session that asked for them.
"""

from __future__ import annotations

import numpy as np
import pytest
from server_support import b64_pcm16_samples, pcm16_b64, silence, tone
from session_support import MODEL_HZ, PCM16K, Harness, engine_pcm

from realtime_ming.audio.config import TurnDetectorConfig
from realtime_ming.engine.api import AudioChunk, FinishReason, TextDelta, TurnDone
from realtime_ming.session import CancelTurn, SessionSettings, VadSettings

T0 = 1000.0  # the virtual clock's origin (monotonic seconds)
WIRE_HZ = 24000


class Listener:
    """The standard client's playback of one response, from the frames and the times they were sent."""

    def __init__(self) -> None:
        self.end_at: float | None = None  # when everything received so far has played
        self.received_ms = 0.0
        self.max_lead_ms = 0.0  # the most unplayed audio held, right after a delta
        self.max_pause_ms = 0.0  # the longest silence inside the reply (a delta that came after the last ran out)

    def delta(self, samples: int, now: float) -> None:
        ms = 1000.0 * samples / WIRE_HZ
        if self.end_at is not None:
            self.max_pause_ms = max(self.max_pause_ms, (now - self.end_at) * 1000.0)
        self.end_at = max(self.end_at or now, now) + ms / 1000.0
        self.received_ms += ms
        self.max_lead_ms = max(self.max_lead_ms, (self.end_at - now) * 1000.0)


class Clocked:
    """A harness driven on the virtual clock; every frame is fed to a `Listener` as it is sent."""

    def __init__(self, lead_ms: int | None = 200, detector: TurnDetectorConfig | None = None, **session) -> None:
        vad = VadSettings(detector=detector or TurnDetectorConfig())
        self.h = Harness(settings=SessionSettings(output_lead_ms=lead_ms, vad=vad))
        self.now = T0
        self.listener = Listener()
        self._seen = 0
        self.send(type="session.update", session={"type": "realtime", "audio": {"input": {"format": PCM16K}},
                                                  "realtime_ming": session})

    def _heard(self) -> None:
        for frame in self.h.frames[self._seen:]:
            if frame["type"] == "response.output_audio.delta":
                self.listener.delta(b64_pcm16_samples(frame["delta"]).size, self.now)
        self._seen = len(self.h.frames)

    def send(self, **event) -> None:
        self.h.send_at(self.now, **event)
        self._heard()

    def engine(self, event) -> None:
        self.h.engine_at(self.now, event)
        self._heard()

    def run_until(self, t: float) -> None:
        """Let time pass to `t`, waking the session at each of its output deadlines (as `SessionRunner` does)."""
        while (deadline := self.h.session.output_deadline) is not None and deadline <= t:
            self.now = max(self.now, deadline)
            self.h.tick(self.now)
            self._heard()
        self.now = t

    def speak(self, samples: np.ndarray, step_s: float = 0.02) -> None:
        """Stream 16 kHz input in real time (20 ms appends), time passing between them."""
        step = int(step_s * MODEL_HZ)
        for start in range(0, samples.size, step):
            self.run_until(self.now + step_s)
            self.send(type="input_audio_buffer.append", audio=pcm16_b64(samples[start: start + step]))

    def respond(self, seconds: float, done: bool = True) -> str:
        """A spoken response whose engine turn delivers `seconds` of audio at once (a fast GPU), then ends."""
        self.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                         "content": [{"type": "input_text", "text": "Hi"}]})
        self.send(type="response.create")
        turn_id = self.h.submitted()[-1].turn_id
        self.engine(TextDelta(turn_id, "Well"))
        self.engine(AudioChunk(turn_id, engine_pcm(seconds)))
        if done:
            self.engine(TurnDone(turn_id, "Well", FinishReason.STOP, 1, 1, 1, 0, {}))
        return turn_id

    def types(self, since: int = 0) -> list[str]:
        return self.h.types(since)


def _sent_ms(frames: list[dict]) -> float:
    return sum(1000.0 * b64_pcm16_samples(f["delta"]).size / WIRE_HZ for f in frames
               if f["type"] == "response.output_audio.delta")


@pytest.mark.parametrize("lead_ms", [40, 200, 400])
def test_paced_output_keeps_the_listener_within_the_lead_and_loses_nothing(lead_ms):
    """3 s generated at once: the client never holds more than the lead; every sample arrives, in order, and
    response.done follows the last delta (the reply is 'active' while it plays)."""
    c = Clocked(lead_ms)
    c.respond(3.0)
    assert _sent_ms(c.h.frames) <= lead_ms + 1.0
    assert "response.done" not in c.types()
    c.run_until(T0 + 5.0)
    assert c.listener.max_lead_ms <= lead_ms + 1.0  # resampler rounding: a sample or two
    assert c.types()[-1] == "response.done" and c.h.last("response.done")["response"]["status"] == "completed"
    assert abs(c.listener.received_ms - 3000.0) < 5.0
    item = c.h.last("response.done")["response"]["output"][0]
    assert c.types().index("response.done") > max(i for i, t in enumerate(c.types()) if t.endswith("audio.delta"))
    assert item["status"] == "completed"


def test_unpaced_output_goes_out_as_generated():
    c = Clocked(lead_ms=None)
    c.respond(3.0)
    assert "response.done" in c.types() and abs(c.listener.received_ms - 3000.0) < 5.0


def test_the_guard_follows_playback_not_generation():
    """Unpaced, 3 s generated at once (response.done at once): a backchannel 1 s into playback does not start a
    turn (the guard is on while the audio plays); the same burst after playback ended does."""
    c = Clocked(lead_ms=None)
    c.respond(3.0)
    assert c.h.session.active_response_id is None  # generation is over...
    c.speak(silence(1.0, MODEL_HZ))
    since = len(c.h.frames)
    c.speak(np.concatenate([tone(0.3, MODEL_HZ), silence(0.6, MODEL_HZ)]))  # ...but a 300 ms burst is a backchannel
    assert "input_audio_buffer.speech_started" not in c.types(since)
    c.speak(silence(1.5, MODEL_HZ))  # playback is over
    c.speak(np.concatenate([tone(0.3, MODEL_HZ), silence(0.6, MODEL_HZ)]))
    assert "input_audio_buffer.speech_started" in c.types(since)


def test_a_backchannel_after_generation_pauses_the_reply_and_it_resumes_where_it_stopped():
    """Paced, generation over (TurnDone in): a backchannel holds the output; it resumes with nothing lost, the
    response completes and its item holds every sample."""
    c = Clocked(200)
    turn_id = c.respond(4.0)
    c.speak(silence(1.0, MODEL_HZ))
    since = len(c.h.frames)
    c.speak(tone(0.1, MODEL_HZ))
    assert c.h.session._gate.holds(turn_id)
    held_at = c.now
    c.speak(np.concatenate([tone(0.2, MODEL_HZ), silence(0.6, MODEL_HZ)]))
    assert not c.h.session._gate.active
    c.run_until(c.now + 5.0)
    types = c.types(since)
    assert "input_audio_buffer.speech_started" not in types and CancelTurn(turn_id) not in c.h.commands
    assert c.h.last("response.done")["response"]["status"] == "completed"
    assert abs(c.listener.received_ms - 4000.0) < 5.0
    assert c.listener.max_lead_ms <= 201.0
    assert held_at < c.now


@pytest.mark.parametrize("max_pause_ms", [650, 600, None])
def test_a_long_one_word_backchannel_pauses_the_reply_at_most_max_pause(max_pause_ms):
    """Paced (150 ms): a 600 ms burst is held for its length and the gap that ends it (300 ms), which the listener
    would hear as a pause of ~750 ms (None: no bound). Once its word is over the hold ends when the listener has heard
    `barge_in_max_pause_ms` of silence, although the candidate is still judged; nothing is lost."""
    detector = TurnDetectorConfig(barge_in_max_pause_ms=60000 if max_pause_ms is None else max_pause_ms)
    c = Clocked(150, detector)
    turn_id = c.respond(5.0)
    c.speak(silence(1.0, MODEL_HZ))
    since = len(c.h.frames)
    c.speak(np.concatenate([tone(0.6, MODEL_HZ), silence(0.25, MODEL_HZ)]))
    assert c.h.session._input.judging_barge_in  # still a candidate (a second word would interrupt)...
    assert c.h.session._gate.active is (max_pause_ms is None)  # ...but no longer held
    c.speak(silence(1.0, MODEL_HZ))
    c.run_until(c.now + 6.0)
    assert "input_audio_buffer.speech_started" not in c.types(since) and CancelTurn(turn_id) not in c.h.commands
    assert c.h.last("response.done")["response"]["status"] == "completed"
    assert abs(c.listener.received_ms - 5000.0) < 5.0
    if max_pause_ms is None:
        assert c.listener.max_pause_ms > 700.0
    else:
        assert max_pause_ms - 1.0 <= c.listener.max_pause_ms <= max_pause_ms + 1.0


def test_a_second_word_after_the_pause_bound_ended_the_hold_still_interrupts():
    """The hold of a 600 ms burst ends at the pause bound (500 ms); a second word 250 ms after the burst (within
    `barge_in_max_gap_ms`) is an interruption: speech_started at its first window, the response cancelled."""
    c = Clocked(150, TurnDetectorConfig(barge_in_max_pause_ms=500))
    turn_id = c.respond(5.0)
    c.speak(silence(1.0, MODEL_HZ))
    since = len(c.h.frames)
    c.speak(tone(0.1, MODEL_HZ))
    assert c.h.session._gate.holds(turn_id)
    held = len(c.h.frames)
    c.speak(np.concatenate([tone(0.5, MODEL_HZ), silence(0.25, MODEL_HZ)]))
    assert not c.h.session._gate.active and "input_audio_buffer.speech_started" not in c.types(since)
    assert "response.output_audio.delta" in c.types(held)  # the reply resumed
    c.speak(tone(0.1, MODEL_HZ))
    assert "input_audio_buffer.speech_started" in c.types(since)
    done = c.h.last("response.done")["response"]
    assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "turn_detected")
    assert CancelTurn(turn_id) in c.h.commands


def test_an_interruption_after_generation_cancels_what_waits():
    """Paced, generation over: a real interruption cancels the response (turn_detected) without another delta;
    the item holds exactly what was sent, which the listener heard whole (the hold let the lead play out); the
    opted-in session is told cleared."""
    c = Clocked(200, output_audio_buffer=True)
    turn_id = c.respond(4.0)
    c.speak(silence(1.0, MODEL_HZ))
    since = len(c.h.frames)
    c.speak(np.concatenate([tone(1.0, MODEL_HZ), silence(0.2, MODEL_HZ)]))
    types = c.types(since)
    started = types.index("input_audio_buffer.speech_started")
    assert "response.output_audio.delta" not in types[started:]
    done = c.h.last("response.done")["response"]
    assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "turn_detected")
    assert CancelTurn(turn_id) in c.h.commands
    assert c.h.last("output_audio_buffer.cleared")["response_id"] == turn_id
    assert "conversation.item.truncated" not in types  # nothing sent went unheard
    assert c.h.session._playback.latest.position_ms(c.now) == pytest.approx(_sent_ms(c.h.frames), abs=0.1)
    assert 800.0 < _sent_ms(c.h.frames) < 1500.0  # 1 s played, the lead, then the hold
    assert types.index("output_audio_buffer.cleared") > types.index("response.done")
    assert "output_audio_buffer.stopped" not in c.types()


def test_output_audio_buffer_started_and_stopped_bracket_the_playback():
    c = Clocked(200, output_audio_buffer=True)
    turn_id = c.respond(1.0)
    types = c.types()
    assert types.index("output_audio_buffer.started") > types.index("response.output_audio.delta")
    assert "output_audio_buffer.stopped" not in types
    c.run_until(T0 + 3.0)
    types = c.types()
    assert types.count("output_audio_buffer.stopped") == 1 and types[-1] == "output_audio_buffer.stopped"
    assert types.index("output_audio_buffer.stopped") > types.index("response.done")
    assert c.h.last("output_audio_buffer.stopped")["response_id"] == turn_id


def test_no_output_audio_buffer_events_without_the_opt_in():
    c = Clocked(200)
    c.respond(1.0)
    c.run_until(T0 + 3.0)
    assert not [t for t in c.types() if t.startswith("output_audio_buffer.")]


def test_output_audio_buffer_clear_cuts_the_reply_at_the_played_position():
    """The client's clear while a paced reply plays: the response is cancelled (client_cancelled), its item is
    truncated at the played position and the server answers cleared (without the opt-in too)."""
    c = Clocked(200)
    c.h.allow_opt_in = True  # `output_audio_buffer.cleared` answers the client's own clear
    turn_id = c.respond(4.0, done=False)
    c.run_until(T0 + 1.5)
    since = len(c.h.frames)
    c.send(type="output_audio_buffer.clear")
    types = c.types(since)
    assert types[-2:] == ["conversation.item.truncated", "output_audio_buffer.cleared"], types
    done = c.h.last("response.done")["response"]
    assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "client_cancelled")
    assert CancelTurn(turn_id) in c.h.commands
    assert abs(c.h.last("conversation.item.truncated")["audio_end_ms"] - 1500.0) <= 2.0
    c.send(type="output_audio_buffer.clear")  # nothing plays any more: answered all the same
    assert c.types()[-1] == "output_audio_buffer.cleared"


def test_output_audio_buffer_clear_before_any_reply_is_an_error():
    c = Clocked(200)
    c.send(type="output_audio_buffer.clear", event_id="evt_clear")
    error = c.h.last("error")["error"]
    assert (error["code"], error["event_id"]) == ("output_audio_buffer_empty", "evt_clear")


def test_a_client_truncate_stops_the_clock():
    """After the client truncated the playing item, Ming is no longer heard: a short burst starts a turn."""
    c = Clocked(lead_ms=None)
    c.respond(4.0)
    c.speak(silence(0.5, MODEL_HZ))
    item_id = c.h.last("response.done")["response"]["output"][0]["id"]
    c.send(type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=500)
    since = len(c.h.frames)
    c.speak(np.concatenate([tone(0.3, MODEL_HZ), silence(0.6, MODEL_HZ)]))
    assert "input_audio_buffer.speech_started" in c.types(since)


def test_the_drain_deadline_sends_a_finished_paced_reply_whole_and_cancels_a_running_one():
    """The server's drain deadline (`SessionRunner.end_responses`: `Playout.release`, then `shutdown.end_responses`):
    a paced reply whose engine turn has finished sends the rest of its audio at once and completes; a reply still
    generating ends cancelled (server_shutting_down) with what it had."""
    from realtime_ming.session.shutdown import end_responses

    c = Clocked(150)
    c.respond(3.0)
    assert _sent_ms(c.h.frames) < 3000.0 - 1.0  # paced: most of it still waits
    session = c.h.session
    c.h.apply(session.playout.release(c.now) + end_responses(session.responses, c.now))
    c._heard()
    done = c.h.last("response.done")["response"]
    assert done["status"] == "completed" and abs(c.listener.received_ms - 3000.0) < 5.0

    since = len(c.h.frames)
    c.respond(3.0, done=False)
    c.h.apply(session.playout.release(c.now) + end_responses(session.responses, c.now))
    done = c.h.last("response.done")["response"]
    assert done["status"] == "cancelled" and done["status_details"]["error"]["code"] == "server_shutting_down"
    assert _sent_ms(c.h.frames[since:]) > 2900.0  # what it had generated went out first
