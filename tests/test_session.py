"""The Sans-I/O session state machine, driven with wire frames and scripted engine events.

Every server event the session emits is serialised for its dialect and validated against the
openai SDK's server-event union (tests/realtime_validate.py; only our 16 / 44.1 kHz extension
rates are exempt, server_support.validate_frame). Turn-taking tests use a scripted
energy VAD (the detector itself is tested in test_audio_turns.py) and 16 kHz input, so sample
counts are exact.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from server_support import b64_pcm16_samples, tone
from session_support import AUDIO_CLOSE, ENGINE_HZ, MODEL_HZ, PCM16K, Harness, audio_deltas, engine_pcm, last_error

from realtime_ming.audio.resample import resampled_length
from realtime_ming.engine.api import (
    AudioChunk,
    ContentKind,
    FailureCode,
    FinishReason,
    TurnCancelled,
    TurnDone,
    TurnFailed,
)
from realtime_ming.session import CancelTurn, CloseConversation, ResponseFinished, SessionSettings


# ---- session configuration ------------------------------------------------------------------


def test_session_created_is_first_and_full():
    """The first event is session.created with the GA realtime session and the server_vad defaults."""
    h = Harness()
    assert h.types() == ["session.created"]
    session = h.frames[0]["session"]
    assert session["type"] == "realtime" and session["model"] == "ming-test"
    assert session["audio"]["output"]["voice"] == "DB30"
    vad = session["audio"]["input"]["turn_detection"]
    assert (vad["type"], vad["threshold"], vad["prefix_padding_ms"], vad["silence_duration_ms"]) == (
        "server_vad", 0.5, 300, 500)


def test_session_update_answers_once_with_full_session():
    """One session.updated per session.update, carrying the full effective session."""
    h = Harness()
    h.send(type="session.update", event_id="client-event-1", session={"type": "realtime", "instructions": "Be brief."})
    assert h.types(1) == ["session.updated"]
    session = h.frames[1]["session"]
    assert session["instructions"] == "Be brief."
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert "client-event-1" not in json.dumps(h.frames[1])


def test_session_update_rejected_keeps_state():
    """An unsupported input rate is an error naming the param; the live session is unchanged."""
    h = Harness()
    before = h.session.config
    h.send(type="session.update", event_id="c2",
           session={"type": "realtime", "instructions": "x", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 22050}}}})
    error = last_error(h)
    assert (error["code"], error["param"], error["event_id"]) == (
        "unsupported_sample_rate", "session.audio.input.format.rate", "c2")
    assert h.session.config == before
    assert "session.updated" not in h.types()


def test_session_update_unknown_voice():
    """A voice outside the engine's presets gives unknown_voice."""
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"output": {"voice": "nope"}}})
    assert last_error(h)["code"] == "unknown_voice"
    assert h.session.config.voice == "DB30"


def test_semantic_vad_accepted():
    """semantic_vad (openai-agents' default) is accepted and echoed."""
    h = Harness()
    h.send(type="session.update", session={
        "type": "realtime", "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}})
    assert h.last("session.updated")["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"


# ---- input buffer and manual turns ----------------------------------------------------------


def test_manual_commit_under_100ms_is_commit_empty():
    """A commit of 50 ms gives input_audio_buffer_commit_empty with OpenAI's message."""
    h = Harness()
    h.send(type="session.update", session={
        "type": "realtime", "audio": {"input": {"format": PCM16K, "turn_detection": None}}})
    h.append(tone(0.05, MODEL_HZ))
    h.send(type="input_audio_buffer.commit")
    error = last_error(h)
    assert error["code"] == "input_audio_buffer_commit_empty"
    assert error["message"] == ("Error committing input audio buffer: buffer too small. Expected at least 100ms"
                                " of audio, but buffer only has 50.00ms of audio.")


def test_manual_commit_creates_item_but_no_response():
    """commit → committed + item added/done (one item_id), no engine turn; response.create submits it."""
    h = Harness()
    h.manual_audio_turn(0.2)
    committed, added, done = (h.last(t) for t in (
        "input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"))
    assert committed["item_id"] == added["item"]["id"] == done["item"]["id"]
    assert "audio" not in added["item"]["content"][0]
    assert h.submitted() == []
    h.send(type="response.create")
    (request,) = h.submitted()
    user = request.history[-1]
    assert user.role == "user" and user.content[0].kind is ContentKind.AUDIO
    assert user.content[0].sample_rate_hz == MODEL_HZ
    np.testing.assert_allclose(user.content[0].audio, tone(0.2, MODEL_HZ), atol=1 / 32768)


def test_append_bad_audio_is_invalid_audio_and_session_continues():
    """Bad base64 and an odd PCM16 byte count each give invalid_audio; later audio still commits."""
    h = Harness()
    h.manual_audio_turn(0.0)  # manual mode; the empty commit error is not under test
    h.send(type="input_audio_buffer.append", audio="!!notbase64!!")
    assert last_error(h)["code"] == "invalid_audio"
    h.send(type="input_audio_buffer.append", audio=base64.b64encode(b"\x01\x02\x03").decode())
    assert last_error(h)["code"] == "invalid_audio"
    h.append(tone(0.2, MODEL_HZ))
    h.send(type="input_audio_buffer.commit")
    assert h.types()[-3:] == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]


def test_append_beyond_buffer_limit_is_rejected():
    """Audio beyond max_input_audio_s gives input_audio_buffer_too_large and is not buffered."""
    h = Harness(settings=SessionSettings(max_input_audio_s=1.0))
    h.manual_audio_turn(0.0)
    h.append(tone(0.9, MODEL_HZ), chunk_samples=MODEL_HZ)
    h.append(tone(0.2, MODEL_HZ), chunk_samples=MODEL_HZ)
    assert last_error(h)["code"] == "input_audio_buffer_too_large"
    h.send(type="input_audio_buffer.commit")
    h.send(type="response.create")
    assert h.submitted()[-1].history[-1].content[0].audio.size == int(0.9 * MODEL_HZ)


def test_clear_answers_cleared_and_empties_buffer():
    """input_audio_buffer.clear → cleared; a following commit finds nothing."""
    h = Harness()
    h.manual_audio_turn(0.0)
    h.append(tone(0.3, MODEL_HZ))
    h.send(type="input_audio_buffer.clear")
    assert h.types()[-1] == "input_audio_buffer.cleared"
    h.send(type="input_audio_buffer.commit")
    assert last_error(h)["code"] == "input_audio_buffer_commit_empty"


# ---- responses ------------------------------------------------------------------------------


def _audio_at(h: Harness, turn_id: str, pcm: np.ndarray, now: float) -> list[np.ndarray]:
    start = len(h.frames)
    h._take(h.session.handle_engine_event(AudioChunk(turn_id, pcm), now))
    return audio_deltas(h.frames[start:])


def _stream_audio(paced: bool, chunks: int = 16, chunk_s: float = 0.32) -> tuple[list[list[int]], np.ndarray]:
    """Feed `chunks` engine chunks, all at one instant (a fast engine) or one chunk duration apart (real time):
    the delta sizes per chunk and every sample sent."""
    h = Harness()
    h.manual_audio_turn()
    h.send(type="response.create")
    turn_id = h.submitted()[0].turn_id
    sizes, samples = [], []
    for k in range(chunks):
        deltas = _audio_at(h, turn_id, engine_pcm(chunk_s), 1000.0 + (k * chunk_s if paced else 0.0))
        sizes.append([d.size for d in deltas])
        samples += deltas
    return sizes, np.concatenate(samples)


def test_audio_far_ahead_of_real_time_goes_out_in_whole_chunks():
    """A fast engine (all chunks at one instant) gets `output_frame_ms` (40 ms at 24 kHz: 960 samples) deltas until
    the audio sent is AHEAD_WHOLE_CHUNKS_S ahead of real time, then one delta per engine chunk (a slow reader's
    send queue holds a few events, not ~25 a second); a real-time engine always gets 40 ms deltas. Same samples."""
    from realtime_ming.session.response import AHEAD_WHOLE_CHUNKS_S

    fast, fast_pcm = _stream_audio(paced=False)
    paced, paced_pcm = _stream_audio(paced=True)
    np.testing.assert_array_equal(fast_pcm, paced_pcm)
    assert all(max(s) <= 960 for s in paced if s)
    sent_before = np.cumsum([0] + [sum(s) for s in fast])[:-1] / 24000
    for sent, s in zip(sent_before, fast):
        if sent > AHEAD_WHOLE_CHUNKS_S:
            assert len(s) == 1, (sent, s)  # the whole chunk in one delta
        else:
            assert max(s) <= 960, (sent, s)
    assert sum(len(s) == 1 for s in fast) >= 8


def test_response_events_in_ga_order_with_exact_audio():
    """A spoken response follows the order of docs/protocol.md §5.2; 0.5 s at 44.1 kHz arrives as 12000 samples at 24 kHz in ≤ 40 ms deltas."""
    h = Harness()
    h.manual_audio_turn()
    start = len(h.frames)
    h.send(type="response.create")
    turn_id = h.submitted()[0].turn_id
    pcm = engine_pcm(0.5)
    h.finish_turn(turn_id, "Hi there", pcm)
    types = [t for t in h.types(start) if t != "response.output_audio.delta"]
    assert h.types(start)[:4] == ["response.created", "response.output_item.added", "conversation.item.added",
                                  "response.content_part.added"]
    assert types[4:] == ["response.output_audio_transcript.delta"] + AUDIO_CLOSE
    deltas = audio_deltas(h.frames[start:])
    assert sum(d.size for d in deltas) == resampled_length(pcm.size, ENGINE_HZ, 24000) == 12000
    assert max(d.size for d in deltas) <= 960
    done = h.last("response.done")["response"]
    assert done["id"] == turn_id and done["status"] == "completed"
    assert done["output"][0]["content"][0] == {"type": "output_audio", "transcript": "Hi there"}
    assert done["usage"]["input_tokens"] == 12 and done["usage"]["output_tokens"] == 3
    assert h.last("response.output_audio_transcript.done")["transcript"] == "Hi there"


@pytest.mark.parametrize(("fmt", "expected"), [
    ({"type": "audio/pcm", "rate": 44100}, ("pcm", 22050)),
    ({"type": "audio/pcmu"}, ("bytes", 4000)),
])
def test_output_formats_carry_their_declared_rate(fmt, expected):
    """Native 44.1 kHz output passes every sample; G.711 µ-law carries 8000 one-byte samples per second."""
    h = Harness()
    h.manual_audio_turn()
    h.send(type="session.update", session={"type": "realtime", "audio": {"output": {"format": fmt}}})
    h.send(type="response.create")
    start = len(h.frames)
    h.finish_turn(h.submitted()[0].turn_id, "Hi", engine_pcm(0.5))
    raw = [base64.b64decode(f["delta"]) for f in h.frames[start:] if f["type"] == "response.output_audio.delta"]
    kind, count = expected
    assert sum(len(r) for r in raw) == (count * 2 if kind == "pcm" else count)


def test_text_only_response_has_no_audio():
    """output_modalities ["text"]: a text turn in the engine, output_text events, no audio events."""
    h = Harness()
    h.manual_audio_turn()
    h.send(type="response.create", response={"output_modalities": ["text"]})
    (request,) = h.submitted()
    assert request.with_audio is False and request.voice is None
    start = len(h.frames)
    h.finish_turn(request.turn_id, "Plain words", engine_pcm(0.1))
    types = h.types(start)
    assert types == ["response.output_text.delta", "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "conversation.item.done", "response.done"]
    assert h.last("response.done")["response"]["output"][0]["content"][0] == {
        "type": "output_text", "text": "Plain words"}


def test_second_response_create_is_rejected():
    """response.create during an active response → conversation_already_has_active_response."""
    h = Harness()
    h.manual_audio_turn()
    h.send(type="response.create")
    h.send(type="response.create", event_id="again")
    error = last_error(h)
    assert (error["code"], error["event_id"]) == ("conversation_already_has_active_response", "again")
    assert h.submitted()[0].turn_id in error["message"]
    assert len(h.submitted()) == 1


def test_response_cancel_ends_response_once_and_drops_later_output():
    """response.cancel → CancelTurn, every .done once, response.done cancelled/client_cancelled; later output dropped."""
    h = Harness()
    h.manual_audio_turn()
    h.send(type="response.create")
    turn_id = h.submitted()[0].turn_id
    h.engine(AudioChunk(turn_id, engine_pcm(0.1)))
    start = len(h.frames)
    h.send(type="response.cancel")
    assert CancelTurn(turn_id) in h.commands
    assert h.types(start) == AUDIO_CLOSE
    details = h.last("response.done")["response"]["status_details"]
    assert (details["type"], details["reason"]) == ("cancelled", "client_cancelled")
    assert h.engine(AudioChunk(turn_id, engine_pcm(0.1))) == []
    assert h.engine(TurnCancelled(turn_id, "")) == []
    h.send(type="response.cancel")
    assert last_error(h)["code"] == "response_cancel_not_active"


def test_length_limit_is_incomplete():
    """A turn stopped by max tokens ends incomplete with reason max_output_tokens."""
    h = Harness()
    h.manual_audio_turn()
    h.send(type="response.create", response={"max_output_tokens": 7})
    (request,) = h.submitted()
    assert request.sampling.max_tokens == 7
    h.engine(TurnDone(request.turn_id, "a b", FinishReason.LENGTH, 5, 0, 7, 0, {}))
    response = h.last("response.done")["response"]
    assert (response["status"], response["status_details"]["reason"]) == ("incomplete", "max_output_tokens")


def test_engine_failure_fails_only_the_response():
    """TurnFailed → response.done failed with engine_error details, no error event; the next response works."""
    h = Harness()
    h.manual_audio_turn()
    h.send(type="response.create")
    h.engine(TurnFailed(h.submitted()[0].turn_id, "boom"))
    response = h.last("response.done")["response"]
    assert response["status"] == "failed"
    assert response["status_details"]["error"]["code"] == "engine_error"
    assert "error" not in h.types()
    h.send(type="response.create")
    assert len(h.submitted()) == 2


def test_timings_event_only_after_opt_in():
    """With realtime_ming.timing_events the response ends with a timings event (ms after input end)."""
    h = Harness()
    h.manual_audio_turn()
    h.send(type="response.create")
    h.finish_turn(h.submitted()[0].turn_id, "Hi", engine_pcm(0.1))
    assert "realtime_ming.response.timings" not in h.types()
    h.send(type="session.update", session={"type": "realtime", "realtime_ming": {"timing_events": True}})
    h.send(type="response.create")
    h.finish_turn(h.submitted()[1].turn_id, "Hi", engine_pcm(0.1))
    assert h.types()[-2:] == ["response.done", "realtime_ming.response.timings"]
    timings = h.frames[-1]["timings"]
    assert {"submitted", "first_audio_delta", "response_done"} <= set(timings)


def test_finished_record_reports_ttfa():
    """The metrics record of a spoken response has its TTFA and status."""
    h = Harness()
    h.manual_audio_turn()
    h.send(type="response.create")
    h.finish_turn(h.submitted()[0].turn_id, "Hi", engine_pcm(0.1))
    (record,) = [c for c in h.commands if isinstance(c, ResponseFinished)]
    assert record.status.value == "completed" and record.ttfa_s is not None and record.ttfa_s >= 0


# ---- conversation items ---------------------------------------------------------------------


def _completed_audio_response(h: Harness, seconds: float = 1.0) -> str:
    h.manual_audio_turn()
    h.send(type="response.create")
    turn_id = h.submitted()[-1].turn_id
    h.finish_turn(turn_id, "one two three four five six seven eight", engine_pcm(seconds))
    return h.last("response.done")["response"]["output"][0]["id"]


def test_truncate_cuts_audio_and_transcript():
    """truncate at 400 ms → truncated; the item keeps 9600 samples at 24 kHz and a shorter transcript."""
    h = Harness()
    item_id = _completed_audio_response(h)
    h.send(type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=400)
    assert h.last("conversation.item.truncated") | {"event_id": None} == {
        "type": "conversation.item.truncated", "event_id": None, "item_id": item_id, "content_index": 0,
        "audio_end_ms": 400}
    h.send(type="conversation.item.retrieve", item_id=item_id)
    part = h.last("conversation.item.retrieved")["item"]["content"][0]
    assert b64_pcm16_samples(part["audio"]).size == 9600
    assert part["transcript"] == "one two three"
    assert h.session.conversation.history()[-1].content[0].text == "one two three"


def test_truncate_errors():
    """Beyond the audio, unknown item and a user item each give their truncate error code."""
    h = Harness()
    item_id = _completed_audio_response(h, 0.5)
    h.send(type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=5000)
    assert last_error(h)["code"] == "truncate_audio_end_ms_invalid"
    h.send(type="conversation.item.truncate", item_id="item_nope", content_index=0, audio_end_ms=10)
    assert last_error(h)["code"] == "item_truncate_invalid_item_id"
    user_id = h.last("input_audio_buffer.committed")["item_id"]
    h.send(type="conversation.item.truncate", item_id=user_id, content_index=0, audio_end_ms=10)
    assert last_error(h)["code"] == "truncate_content_index_invalid"


def _png_data_url(pixels: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_item_create_text_and_image_reach_the_engine():
    """input_text + input_image items: added/done, and the turn's history holds the decoded RGB pixels
    (64x96 is already a size the vision preprocessing keeps, so the pixels arrive unchanged)."""
    h = Harness()
    pixels = (np.arange(64 * 96 * 3) % 251).astype(np.uint8).reshape(64, 96, 3)
    h.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": _png_data_url(pixels)}]})
    assert h.types()[-2:] == ["conversation.item.added", "conversation.item.done"]
    h.send(type="response.create")
    (request,) = h.submitted()
    text, image = request.history[-1].content
    assert text.text == "What is this?"
    np.testing.assert_array_equal(image.image, pixels)


def test_item_create_invalid_image():
    """An input_image whose data is not an image gives invalid_image and creates nothing."""
    h = Harness()
    h.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(b"nope").decode()}]})
    assert last_error(h)["code"] == "invalid_image"
    assert len(h.session.conversation) == 0


def test_item_retrieve_delete_and_their_errors():
    """retrieve/delete of an unknown id give their codes; delete removes the item from the model's history."""
    h = Harness()
    h.send(type="conversation.item.retrieve", item_id="item_x", event_id="r1")
    assert (last_error(h)["code"], last_error(h)["event_id"]) == ("item_retrieve_invalid_item_id", "r1")
    h.send(type="conversation.item.delete", item_id="item_x")
    assert last_error(h)["code"] == "item_delete_invalid_item_id"
    h.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
    item_id = h.last("conversation.item.done")["item"]["id"]
    h.send(type="conversation.item.retrieve", item_id=item_id)
    assert h.last("conversation.item.retrieved")["item"]["content"] == [{"type": "input_text", "text": "hi"}]
    h.send(type="conversation.item.delete", item_id=item_id)
    assert h.last("conversation.item.deleted")["item_id"] == item_id
    assert h.session.conversation.history() == ()


def test_close_frees_the_engine():
    """Closing with an active response cancels its turn and frees the conversation's KV slot."""
    h = Harness()
    h.manual_audio_turn()
    h.send(type="response.create")
    turn_id = h.submitted()[0].turn_id
    assert h.session.close() == [CancelTurn(turn_id), CloseConversation(h.session.conversation_id)]


def test_failed_response_after_parallel_calls_removes_only_the_new_results_and_announces_each():
    """user, two function calls, their two results, then a response that fails on its input: the two results
    are removed, each with conversation.item.deleted; the question and the calls stay (issue 43)."""
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "output_modalities": ["text"],
                                           "audio": {"input": {"turn_detection": None}}})
    h.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Paris and Lyon?"}]})
    for call in "ab":
        h.send(type="conversation.item.create", item={"type": "function_call", "name": "get_weather",
                                                      "call_id": f"call_{call}", "arguments": "{}"})
    for call in "ab":
        h.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": f"call_{call}",
                                                      "output": "sunny"})
    ids = [f["item"]["id"] for f in h.frames if f["type"] == "conversation.item.done"]
    h.send(type="response.create")
    (request,) = h.submitted()
    assert [(m.role, len(m.tool_calls)) for m in request.history] == [("user", 0), ("assistant", 2), ("tool", 0),
                                                                       ("tool", 0)]
    since = len(h.frames)
    h.engine(TurnFailed(request.turn_id, "prompt of 9000 tokens exceeds max_seq_len", FailureCode.INVALID_PROMPT))
    assert h.types(since)[-3:] == ["response.done", "conversation.item.deleted", "conversation.item.deleted"]
    assert [f["item_id"] for f in h.frames[-2:]] == ids[3:]
    assert [e.id for e in reversed(h.session.conversation.newest_first())][:3] == ids[:3]
