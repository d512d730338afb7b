"""The session state machine's turn-taking and per-session audio options: server VAD turns (speculative,
confirmed, discarded), barge-in and backchannels, the beta dialect's names and G.711 input, noise reduction and
the idle timeout. Driven like test_session.py (tests/session_support.py's `Harness`, a scripted energy VAD and
16 kHz input, so sample counts are exact).
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
from server_support import silence, tone
from session_support import AUDIO_CLOSE, MODEL_HZ, Harness, engine_pcm, last_error, vad_harness, vad_response

from realtime_ming.engine.api import AudioChunk
from realtime_ming.protocol import Dialect
from realtime_ming.session import CancelTurn, ConfirmTurn, DiscardTurn, ResponseFinished


# ---- server VAD turns -----------------------------------------------------------------------


def test_vad_turn_events_share_item_id_and_include_padding():
    """speech_started (onset − 300 ms) → speech_stopped → committed → item added/done, one item_id; then a response."""
    h = vad_harness()
    h.append(silence(1.0, MODEL_HZ))
    h.append(tone(0.6, MODEL_HZ))
    h.append(silence(1.0, MODEL_HZ))
    started = h.last("input_audio_buffer.speech_started")
    # The tone starts at sample 16000, inside the 512-sample window starting at 15872 (992 ms).
    assert started["audio_start_ms"] == 992 - 300
    item_id = started["item_id"]
    order = [t for t in h.types() if t.startswith(("input_audio_buffer", "conversation.item", "response.created"))]
    assert order[:6] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                         "input_audio_buffer.committed", "conversation.item.added", "conversation.item.done",
                         "response.created"]
    for t in ("input_audio_buffer.speech_stopped", "input_audio_buffer.committed"):
        assert h.last(t)["item_id"] == item_id
    user_item = next(f for f in h.frames if f["type"] == "conversation.item.added")["item"]
    assert user_item["id"] == item_id and user_item["role"] == "user"


def test_vad_turn_is_speculative_then_confirmed():
    """A pause submits a speculative turn; speech stop confirms that same turn as the response."""
    h = vad_harness()
    h.append(silence(0.5, MODEL_HZ))
    h.append(tone(0.6, MODEL_HZ))
    h.append(silence(1.0, MODEL_HZ))
    (request,) = h.submitted()
    assert request.speculative is True
    assert ConfirmTurn(request.turn_id) in h.commands
    assert h.last("response.created")["response"]["id"] == request.turn_id
    # The committed user item is exactly the audio the speculative turn heard.
    user = h.session.conversation.history()[-1]
    np.testing.assert_array_equal(user.content[0].audio, request.history[-1].content[0].audio)


def test_vad_speculation_discarded_when_user_resumes():
    """Pause → speculative turn; speech resumes → discarded; the final pause's turn is the one confirmed."""
    h = vad_harness()
    h.append(silence(0.5, MODEL_HZ))
    h.append(tone(0.6, MODEL_HZ))
    h.append(silence(0.25, MODEL_HZ))
    h.append(tone(0.4, MODEL_HZ))
    h.append(silence(1.0, MODEL_HZ))
    first, second = h.submitted()
    kinds = [type(c).__name__ for c in h.commands if not isinstance(c, ResponseFinished)]
    assert kinds == ["SubmitTurn", "DiscardTurn", "SubmitTurn", "ConfirmTurn"]
    assert DiscardTurn(first.turn_id) in h.commands and ConfirmTurn(second.turn_id) in h.commands
    assert h.types().count("input_audio_buffer.speech_started") == 1
    assert h.types().count("input_audio_buffer.speech_stopped") == 1


def test_barge_in_cancels_response_before_new_speech_is_committed():
    """Speech during a response: speech_started, CancelTurn, each .done once, response.done turn_detected, no later deltas."""
    h = vad_harness()
    turn_id = vad_response(h)
    start = len(h.frames)
    h.append(tone(0.9, MODEL_HZ))  # longer than barge_in_min_speech_ms: a real interruption
    types = h.types(start)
    assert types[0] == "input_audio_buffer.speech_started"
    assert types[1:] == AUDIO_CLOSE
    assert CancelTurn(turn_id) in h.commands
    details = h.last("response.done")["response"]["status_details"]
    assert (details["type"], details["reason"]) == ("cancelled", "turn_detected")
    assert h.engine(AudioChunk(turn_id, engine_pcm(0.2))) == []


def test_short_burst_during_response_is_a_backchannel():
    """Speech shorter than barge_in_min_speech_ms, then silence, during a response: no event, no cancel."""
    h = vad_harness()
    turn_id = vad_response(h)
    start = len(h.frames)
    h.append(np.concatenate([tone(0.4, MODEL_HZ), np.zeros(MODEL_HZ, np.float32)]))
    assert h.types(start) == []
    assert CancelTurn(turn_id) not in h.commands
    assert h.session.active_response_id == turn_id


def test_barge_in_disabled_by_interrupt_response_false():
    """interrupt_response false: speech during a response is announced but the response continues."""
    h = vad_harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "interrupt_response": False}}}})
    turn_id = vad_response(h)
    start = len(h.frames)
    h.append(tone(0.3, MODEL_HZ))
    assert h.types(start) == ["input_audio_buffer.speech_started"]
    assert CancelTurn(turn_id) not in h.commands
    assert h.session.active_response_id == turn_id


# ---- beta dialect ---------------------------------------------------------------------------


def test_beta_connection_gets_beta_names():
    """On a beta connection the same turn uses beta event names and no conversation.item.done."""
    h = Harness(Dialect.BETA)
    h.send(type="session.update", session={"turn_detection": None})
    h.append(tone(0.5))
    h.send(type="input_audio_buffer.commit")
    h.send(type="response.create")
    h.finish_turn(h.submitted()[0].turn_id, "Hi", engine_pcm(0.2))
    types = set(h.types())
    assert {"conversation.item.created", "response.audio.delta", "response.audio.done",
            "response.audio_transcript.delta", "response.audio_transcript.done"} <= types
    assert not types & {"conversation.item.added", "conversation.item.done", "response.output_audio.delta"}
    assert h.last("response.done")["response"]["output"][0]["content"][0]["type"] == "audio"


def test_g711_input_is_decoded_to_16k():
    """µ-law input at 8 kHz: a 0.5 s commit reaches the engine as 8000 samples at 16 kHz, close to the tone."""
    from realtime_ming.audio.pcm import float_to_int16, ulaw_encode

    h = Harness()
    h.send(type="session.update", session={
        "type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}, "turn_detection": None}}})
    codes = ulaw_encode(float_to_int16(tone(0.5, 8000)))
    h.send(type="input_audio_buffer.append", audio=base64.b64encode(codes.tobytes()).decode())
    h.send(type="input_audio_buffer.commit")
    h.send(type="response.create")
    audio = h.submitted()[0].history[-1].content[0].audio
    # The commit flushes the resampler's held-back tail: every input sample is in the turn.
    assert audio.size == 8000
    expected = tone(0.5, MODEL_HZ)
    corr = np.dot(audio[500:7500], expected[500:7500])
    assert corr / (np.linalg.norm(audio[500:7500]) * np.linalg.norm(expected[500:7500])) > 0.99


def test_vad_without_create_response_only_commits():
    """create_response false: the VAD turn is committed, but no engine turn or response starts."""
    h = vad_harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "create_response": False}}}})
    h.append(silence(0.5, MODEL_HZ))
    h.append(tone(0.6, MODEL_HZ))
    h.append(silence(1.0, MODEL_HZ))
    assert "input_audio_buffer.committed" in h.types()
    assert "response.created" not in h.types() and h.submitted() == []


def test_openai_voice_names_are_accepted_as_aliases():
    """OpenAI voice names (openai-agents sends "ash") are accepted, echoed, and spoken with the default voice."""
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"output": {"voice": "ash"}}})
    assert h.last("session.updated")["session"]["audio"]["output"]["voice"] == "ash"
    h.manual_audio_turn()
    h.send(type="response.create")
    h.send(type="response.cancel")
    h.send(type="response.create", response={"audio": {"output": {"voice": "other"}}})
    first, second = h.submitted()
    assert (first.voice, second.voice) == ("DB30", "other")


# ---- noise reduction and idle timeout ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["near_field", "far_field"])
def test_noise_reduction_without_the_library_is_refused_not_echoed(kind, monkeypatch):
    """The WebRTC library missing (a platform without its wheel): noise_reduction gets
    unsupported_noise_reduction and the session is unchanged."""
    from realtime_ming.audio import denoise

    def missing():
        raise denoise.DenoiserUnavailable("the webrtc-noise-gain package is not installed")

    monkeypatch.setattr(denoise, "_processor_class", missing)
    h = Harness()
    before = h.session.config
    h.send(type="session.update", event_id="nr", session={
        "type": "realtime", "instructions": "x", "audio": {"input": {"noise_reduction": {"type": kind}}}})
    error = last_error(h)
    assert (error["code"], error["param"], error["event_id"]) == (
        "unsupported_noise_reduction", "session.audio.input.noise_reduction", "nr")
    assert "webrtc-noise-gain" in error["message"]
    assert "session.updated" not in h.types()
    assert h.session.config == before
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"noise_reduction": None}}})
    assert h.types()[-1] == "session.updated"


@pytest.mark.parametrize("kind", ["near_field", "far_field"])
def test_noise_reduction_denoises_before_vad_and_keeps_turns(kind):
    """near_field / far_field on a default install: echoed with OpenAI's default strength 1, and a
    spoken-length tone in silence is still one turn."""
    h = vad_harness()
    h.send(type="session.update", session={
        "type": "realtime", "audio": {"input": {"noise_reduction": {"type": kind}}}})
    assert h.last("session.updated")["session"]["audio"]["input"]["noise_reduction"] == {
        "type": kind, "strength": 1.0}
    h.append(silence(0.5, MODEL_HZ))
    h.append(tone(0.6, MODEL_HZ))
    h.append(silence(1.0, MODEL_HZ))
    assert h.types().count("input_audio_buffer.speech_stopped") == 1
    assert h.types().count("input_audio_buffer.committed") == 1


def _idle_harness(timeout_ms: int) -> Harness:
    h = vad_harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "idle_timeout_ms": timeout_ms}}}})
    return h


def test_idle_timeout_after_playback_prompts_the_user():
    """GA idle_timeout_ms: counted from the end of the reply's playback on the input clock; then
    timeout_triggered, the idle input committed as a user item, and a new response."""
    h = _idle_harness(1000)
    turn_id = vad_response(h)  # the reply so far: 0.2 s of audio
    h.finish_turn(turn_id, pcm=engine_pcm(0.3))  # 0.5 s of audio in all
    start = len(h.frames)
    num_submitted = len(h.submitted())
    h.append(silence(1.3, MODEL_HZ))  # 0.5 s playing out + 0.8 s idle: not yet
    assert "input_audio_buffer.timeout_triggered" not in h.types(start)
    h.append(silence(0.4, MODEL_HZ))
    types = h.types(start)
    assert types[:4] == ["input_audio_buffer.timeout_triggered", "input_audio_buffer.committed",
                         "conversation.item.added", "conversation.item.done"]
    assert "response.created" in types
    fired = h.last("input_audio_buffer.timeout_triggered")
    assert fired["item_id"] == h.last("input_audio_buffer.committed")["item_id"]
    assert fired["audio_end_ms"] - fired["audio_start_ms"] >= 1000
    assert len(h.submitted()) == num_submitted + 1
    h.append(silence(3.0, MODEL_HZ))  # fires once per reply; the new reply is still generating
    assert h.types(start).count("input_audio_buffer.timeout_triggered") == 1


def test_idle_timeout_disarmed_by_speech_and_off_by_default():
    """The user speaking before the deadline cancels the timeout; without idle_timeout_ms nothing fires."""
    h = _idle_harness(1000)
    turn_id = vad_response(h)
    h.finish_turn(turn_id)
    h.append(silence(0.5, MODEL_HZ))
    h.append(tone(0.6, MODEL_HZ))
    h.append(silence(2.5, MODEL_HZ))
    assert "input_audio_buffer.timeout_triggered" not in h.types()
    h = vad_harness()
    turn_id = vad_response(h)
    h.finish_turn(turn_id)
    h.append(silence(5.0, MODEL_HZ))
    assert "input_audio_buffer.timeout_triggered" not in h.types()
