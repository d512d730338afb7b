"""The reply's output is held from the first speech window of a possible interruption until it is judged.

Sans-I/O session (energy VAD, 16 kHz input): engine output that arrives while a guarded candidate is
judged is not sent; a backchannel releases all of it in order (nothing lost), a real interruption
cancels the response and the held audio never reaches the wire (the item holds exactly what was sent).
"""

from __future__ import annotations

import numpy as np
from server_support import b64_pcm16_samples, silence, tone
from session_support import MODEL_HZ, Harness, engine_pcm, vad_harness, vad_response

from realtime_ming.engine.api import AudioChunk, FinishReason, TextDelta, TurnDone
from realtime_ming.session import CancelTurn


def _sent_samples(h: Harness, since: int = 0) -> int:
    return sum(b64_pcm16_samples(f["delta"]).size for f in h.frames[since:] if f["type"] == "response.output_audio.delta")


def _start_candidate(h: Harness) -> None:
    """100 ms of speech: the guarded detector is judging a candidate (no speech_started yet)."""
    h.append(tone(0.1, MODEL_HZ))
    assert h.session._input.judging_barge_in


def test_backchannel_holds_then_releases_everything_in_order():
    h = vad_harness()
    turn_id = vad_response(h)
    before = _sent_samples(h)
    _start_candidate(h)
    start = len(h.frames)
    h.engine(TextDelta(turn_id, " done"))
    h.engine(AudioChunk(turn_id, engine_pcm(0.3)))
    assert h.frames[start:] == []  # held: nothing goes out while the candidate is judged
    h.append(np.concatenate([tone(0.2, MODEL_HZ), silence(1.0, MODEL_HZ)]))  # a 300 ms burst: a backchannel
    types = h.types(start)
    assert "input_audio_buffer.speech_started" not in types
    assert types[0] == "response.output_audio_transcript.delta"  # released in arrival order
    assert set(types[1:]) == {"response.output_audio.delta"}
    assert CancelTurn(turn_id) not in h.commands
    # Nothing lost: the item's audio is what was sent, and it covers all the engine audio pushed so far.
    item_audio = np.frombuffer(bytes(h.session.responses.active.item.audio), np.int16)
    assert item_audio.size == _sent_samples(h) > before
    h.engine(TurnDone(turn_id, "Well done", FinishReason.STOP, 1, 1, 1, 0, {}))
    assert h.last("response.done")["response"]["status"] == "completed"


def test_interruption_cancels_and_the_held_audio_never_goes_out():
    h = vad_harness()
    turn_id = vad_response(h)
    sent_before = _sent_samples(h)
    _start_candidate(h)
    start = len(h.frames)
    h.engine(AudioChunk(turn_id, engine_pcm(0.5)))
    h.engine(TurnDone(turn_id, "Well", FinishReason.STOP, 1, 1, 1, 0, {}))  # even its end is held
    assert h.frames[start:] == []
    h.append(tone(0.9, MODEL_HZ))  # a real interruption
    types = h.types(start)
    assert types[0] == "input_audio_buffer.speech_started"
    assert "response.output_audio.delta" not in types
    done = h.last("response.done")["response"]
    assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "turn_detected")
    assert types.count("response.done") == 1
    assert CancelTurn(turn_id) in h.commands
    assert _sent_samples(h) == sent_before


def test_clearing_the_buffer_mid_candidate_releases_the_hold():
    h = vad_harness()
    turn_id = vad_response(h)
    _start_candidate(h)
    start = len(h.frames)
    h.engine(AudioChunk(turn_id, engine_pcm(0.2)))
    h.send(type="input_audio_buffer.clear")
    assert "response.output_audio.delta" in h.types(start)
    assert not h.session._gate.active


def test_a_hold_lasts_at_most_max_hold_s_of_wall_clock():
    """A client that stops streaming mid-candidate cannot freeze the reply."""
    h = vad_harness()
    turn_id = vad_response(h)
    _start_candidate(h)
    since = h.session._gate.since
    start = len(h.frames)
    h.session.handle_engine_event(AudioChunk(turn_id, engine_pcm(0.2)), since + 0.01)
    assert h.frames[start:] == []
    h._take(h.session.handle_engine_event(AudioChunk(turn_id, engine_pcm(0.2)),
                                          since + h.session._gate.max_hold_s + 0.01))
    assert h.types(start).count("response.output_audio.delta") >= 2  # both chunks, in order
    assert not h.session._gate.active
    h.engine(AudioChunk(turn_id, engine_pcm(0.1)))  # the same candidate is not held again
    assert not h.session._gate.active
