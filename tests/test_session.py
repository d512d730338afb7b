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
import time

import numpy as np
import pytest
from server_support import (
    EnergyVad,
    b64_pcm16_samples,
    pcm16_b64,
    silence,
    tone,
    validate_frame,
)

from realtime_ming.audio.resample import resampled_length
from realtime_ming.engine.api import (
    AudioChunk,
    ContentKind,
    FinishReason,
    Stage,
    StageMark,
    TextDelta,
    TurnCancelled,
    TurnDone,
    TurnFailed,
)
from realtime_ming.protocol import Dialect, parse, serialise
from realtime_ming.session import (
    CancelTurn,
    CloseConversation,
    ConfirmTurn,
    DiscardTurn,
    ResponseFinished,
    Send,
    Session,
    SessionSettings,
    SubmitTurn,
)

ENGINE_HZ = 44100
MODEL_HZ = 16000
PCM16K = {"type": "audio/pcm", "rate": 16000}


class Harness:
    """A session plus the frames it sent (validated) and the engine commands it issued."""

    def __init__(self, dialect: Dialect = Dialect.GA, settings: SessionSettings | None = None) -> None:
        self.dialect = dialect
        self.session = Session(
            settings or SessionSettings(),
            dialect=dialect,
            model="ming-test",
            voices=("DB30", "other"),
            default_voice="DB30",
            make_vad=lambda _backend: EnergyVad(),
        )
        self.frames: list[dict] = []
        self.commands: list = []
        self._take(self.session.start())

    def _take(self, actions: list) -> list:
        for action in actions:
            if isinstance(action, Send):
                timings = self.session.config.timing_events
                text = serialise(action.event, self.dialect, timing_events=timings)
                if text is None:
                    continue
                frame = json.loads(text)
                td = self.session.config.turn_detection
                idle = getattr(td, "idle_timeout_ms", None) is not None
                validate_frame(frame, self.dialect, allow_timings=timings, allow_opt_in=idle)
                self.frames.append(frame)
            else:
                self.commands.append(action)
        return actions

    def send(self, **event) -> list:
        """Feed one client event given as wire fields."""
        return self._take(self.session.handle_client_event(parse(json.dumps(event), self.dialect), time.monotonic()))

    def append(self, samples: np.ndarray, chunk_samples: int = 320) -> None:
        for start in range(0, samples.size, chunk_samples):
            self.send(type="input_audio_buffer.append", audio=pcm16_b64(samples[start : start + chunk_samples]))

    def engine(self, event) -> list:
        return self._take(self.session.handle_engine_event(event, time.monotonic()))

    def types(self, since: int = 0) -> list[str]:
        return [f["type"] for f in self.frames[since:]]

    def last(self, event_type: str) -> dict:
        return [f for f in self.frames if f["type"] == event_type][-1]

    def submitted(self) -> list:
        return [c.request for c in self.commands if isinstance(c, SubmitTurn)]

    def manual_audio_turn(self, seconds: float = 0.5) -> None:
        """Manual mode, 16 kHz input, one committed user audio item."""
        self.send(type="session.update", session={
            "type": "realtime", "audio": {"input": {"format": PCM16K, "turn_detection": None}}})
        self.append(tone(seconds, MODEL_HZ))
        self.send(type="input_audio_buffer.commit")

    def finish_turn(self, turn_id: str, text: str = "Hi", pcm: np.ndarray | None = None) -> None:
        self.engine(StageMark(turn_id, Stage.SUBMITTED, time.monotonic()))
        self.engine(TextDelta(turn_id, text))
        if pcm is not None:
            self.engine(AudioChunk(turn_id, pcm))
        self.engine(TurnDone(turn_id, text, FinishReason.STOP, 12, 4, 3, 0 if pcm is None else pcm.size, {}))


def _audio_deltas(frames: list[dict], wire_type: str = "response.output_audio.delta") -> list[np.ndarray]:
    return [b64_pcm16_samples(f["delta"]) for f in frames if f["type"] == wire_type]


def _engine_pcm(seconds: float) -> np.ndarray:
    return (0.2 * np.sin(2 * np.pi * 300 * np.arange(int(seconds * ENGINE_HZ)) / ENGINE_HZ)).astype(np.float32)


def _error(h: Harness) -> dict:
    return h.last("error")["error"]


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
    error = _error(h)
    assert (error["code"], error["param"], error["event_id"]) == (
        "unsupported_sample_rate", "session.audio.input.format.rate", "c2")
    assert h.session.config == before
    assert "session.updated" not in h.types()


def test_session_update_unknown_voice():
    """A voice outside the engine's presets gives unknown_voice."""
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"output": {"voice": "nope"}}})
    assert _error(h)["code"] == "unknown_voice"
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
    error = _error(h)
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
    assert _error(h)["code"] == "invalid_audio"
    h.send(type="input_audio_buffer.append", audio=base64.b64encode(b"\x01\x02\x03").decode())
    assert _error(h)["code"] == "invalid_audio"
    h.append(tone(0.2, MODEL_HZ))
    h.send(type="input_audio_buffer.commit")
    assert h.types()[-3:] == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]


def test_append_beyond_buffer_limit_is_rejected():
    """Audio beyond max_input_audio_s gives input_audio_buffer_too_large and is not buffered."""
    h = Harness(settings=SessionSettings(max_input_audio_s=1.0))
    h.manual_audio_turn(0.0)
    h.append(tone(0.9, MODEL_HZ), chunk_samples=MODEL_HZ)
    h.append(tone(0.2, MODEL_HZ), chunk_samples=MODEL_HZ)
    assert _error(h)["code"] == "input_audio_buffer_too_large"
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
    assert _error(h)["code"] == "input_audio_buffer_commit_empty"


# ---- responses ------------------------------------------------------------------------------

_AUDIO_CLOSE = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def test_response_events_in_ga_order_with_exact_audio():
    """A spoken response follows the order of docs/protocol.md §5.2; 0.5 s at 44.1 kHz arrives as 12000 samples at 24 kHz in ≤ 40 ms deltas."""
    h = Harness()
    h.manual_audio_turn()
    start = len(h.frames)
    h.send(type="response.create")
    turn_id = h.submitted()[0].turn_id
    pcm = _engine_pcm(0.5)
    h.finish_turn(turn_id, "Hi there", pcm)
    types = [t for t in h.types(start) if t != "response.output_audio.delta"]
    assert h.types(start)[:4] == ["response.created", "response.output_item.added", "conversation.item.added",
                                  "response.content_part.added"]
    assert types[4:] == ["response.output_audio_transcript.delta"] + _AUDIO_CLOSE
    deltas = _audio_deltas(h.frames[start:])
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
    h.finish_turn(h.submitted()[0].turn_id, "Hi", _engine_pcm(0.5))
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
    h.finish_turn(request.turn_id, "Plain words", _engine_pcm(0.1))
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
    error = _error(h)
    assert (error["code"], error["event_id"]) == ("conversation_already_has_active_response", "again")
    assert h.submitted()[0].turn_id in error["message"]
    assert len(h.submitted()) == 1


def test_response_cancel_ends_response_once_and_drops_later_output():
    """response.cancel → CancelTurn, every .done once, response.done cancelled/client_cancelled; later output dropped."""
    h = Harness()
    h.manual_audio_turn()
    h.send(type="response.create")
    turn_id = h.submitted()[0].turn_id
    h.engine(AudioChunk(turn_id, _engine_pcm(0.1)))
    start = len(h.frames)
    h.send(type="response.cancel")
    assert CancelTurn(turn_id) in h.commands
    assert h.types(start) == _AUDIO_CLOSE
    details = h.last("response.done")["response"]["status_details"]
    assert (details["type"], details["reason"]) == ("cancelled", "client_cancelled")
    assert h.engine(AudioChunk(turn_id, _engine_pcm(0.1))) == []
    assert h.engine(TurnCancelled(turn_id, "")) == []
    h.send(type="response.cancel")
    assert _error(h)["code"] == "response_cancel_not_active"


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
    h.finish_turn(h.submitted()[0].turn_id, "Hi", _engine_pcm(0.1))
    assert "realtime_ming.response.timings" not in h.types()
    h.send(type="session.update", session={"type": "realtime", "realtime_ming": {"timing_events": True}})
    h.send(type="response.create")
    h.finish_turn(h.submitted()[1].turn_id, "Hi", _engine_pcm(0.1))
    assert h.types()[-2:] == ["response.done", "realtime_ming.response.timings"]
    timings = h.frames[-1]["timings"]
    assert {"submitted", "first_audio_delta", "response_done"} <= set(timings)


def test_finished_record_reports_ttfa():
    """The metrics record of a spoken response has its TTFA and status."""
    h = Harness()
    h.manual_audio_turn()
    h.send(type="response.create")
    h.finish_turn(h.submitted()[0].turn_id, "Hi", _engine_pcm(0.1))
    (record,) = [c for c in h.commands if isinstance(c, ResponseFinished)]
    assert record.status.value == "completed" and record.ttfa_s is not None and record.ttfa_s >= 0


# ---- server VAD turns -----------------------------------------------------------------------


def _vad_harness(dialect: Dialect = Dialect.GA) -> Harness:
    h = Harness(dialect)
    fmt = PCM16K if dialect is Dialect.GA else None
    if fmt is not None:
        h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"format": fmt}}})
    return h


def test_vad_turn_events_share_item_id_and_include_padding():
    """speech_started (onset − 300 ms) → speech_stopped → committed → item added/done, one item_id; then a response."""
    h = _vad_harness()
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
    h = _vad_harness()
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
    h = _vad_harness()
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


def _vad_response(h: Harness) -> str:
    h.append(silence(0.5, MODEL_HZ))
    h.append(tone(0.6, MODEL_HZ))
    h.append(silence(1.0, MODEL_HZ))
    turn_id = h.submitted()[-1].turn_id
    h.engine(TextDelta(turn_id, "Well"))
    h.engine(AudioChunk(turn_id, _engine_pcm(0.2)))
    return turn_id


def test_barge_in_cancels_response_before_new_speech_is_committed():
    """Speech during a response: speech_started, CancelTurn, each .done once, response.done turn_detected, no later deltas."""
    h = _vad_harness()
    turn_id = _vad_response(h)
    start = len(h.frames)
    h.append(tone(0.9, MODEL_HZ))  # longer than barge_in_min_speech_ms: a real interruption
    types = h.types(start)
    assert types[0] == "input_audio_buffer.speech_started"
    assert types[1:] == _AUDIO_CLOSE
    assert CancelTurn(turn_id) in h.commands
    details = h.last("response.done")["response"]["status_details"]
    assert (details["type"], details["reason"]) == ("cancelled", "turn_detected")
    assert h.engine(AudioChunk(turn_id, _engine_pcm(0.2))) == []


def test_short_burst_during_response_is_a_backchannel():
    """Speech shorter than barge_in_min_speech_ms, then silence, during a response: no event, no cancel."""
    h = _vad_harness()
    turn_id = _vad_response(h)
    start = len(h.frames)
    h.append(np.concatenate([tone(0.4, MODEL_HZ), np.zeros(MODEL_HZ, np.float32)]))
    assert h.types(start) == []
    assert CancelTurn(turn_id) not in h.commands
    assert h.session.active_response_id == turn_id


def test_barge_in_disabled_by_interrupt_response_false():
    """interrupt_response false: speech during a response is announced but the response continues."""
    h = _vad_harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "interrupt_response": False}}}})
    turn_id = _vad_response(h)
    start = len(h.frames)
    h.append(tone(0.3, MODEL_HZ))
    assert h.types(start) == ["input_audio_buffer.speech_started"]
    assert CancelTurn(turn_id) not in h.commands
    assert h.session.active_response_id == turn_id


# ---- conversation items ---------------------------------------------------------------------


def _completed_audio_response(h: Harness, seconds: float = 1.0) -> str:
    h.manual_audio_turn()
    h.send(type="response.create")
    turn_id = h.submitted()[-1].turn_id
    h.finish_turn(turn_id, "one two three four five six seven eight", _engine_pcm(seconds))
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
    assert _error(h)["code"] == "truncate_audio_end_ms_invalid"
    h.send(type="conversation.item.truncate", item_id="item_nope", content_index=0, audio_end_ms=10)
    assert _error(h)["code"] == "item_truncate_invalid_item_id"
    user_id = h.last("input_audio_buffer.committed")["item_id"]
    h.send(type="conversation.item.truncate", item_id=user_id, content_index=0, audio_end_ms=10)
    assert _error(h)["code"] == "truncate_content_index_invalid"


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
    assert _error(h)["code"] == "invalid_image"
    assert len(h.session.conversation) == 0


def test_item_retrieve_delete_and_their_errors():
    """retrieve/delete of an unknown id give their codes; delete removes the item from the model's history."""
    h = Harness()
    h.send(type="conversation.item.retrieve", item_id="item_x", event_id="r1")
    assert (_error(h)["code"], _error(h)["event_id"]) == ("item_retrieve_invalid_item_id", "r1")
    h.send(type="conversation.item.delete", item_id="item_x")
    assert _error(h)["code"] == "item_delete_invalid_item_id"
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


# ---- beta dialect ---------------------------------------------------------------------------


def test_beta_connection_gets_beta_names():
    """On a beta connection the same turn uses beta event names and no conversation.item.done."""
    h = Harness(Dialect.BETA)
    h.send(type="session.update", session={"turn_detection": None})
    h.append(tone(0.5))
    h.send(type="input_audio_buffer.commit")
    h.send(type="response.create")
    h.finish_turn(h.submitted()[0].turn_id, "Hi", _engine_pcm(0.2))
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
    h = _vad_harness()
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
def test_noise_reduction_without_rnnoise_is_refused_not_echoed(kind, monkeypatch):
    """RNNoise missing: noise_reduction gets unsupported_noise_reduction and the session is unchanged."""
    from realtime_ming.audio import denoise

    def missing():
        raise denoise.DenoiserUnavailable("package pyrnnoise is not installed")

    monkeypatch.setattr(denoise, "_library", missing)
    h = Harness()
    before = h.session.config
    h.send(type="session.update", event_id="nr", session={
        "type": "realtime", "instructions": "x", "audio": {"input": {"noise_reduction": {"type": kind}}}})
    error = _error(h)
    assert (error["code"], error["param"], error["event_id"]) == (
        "unsupported_noise_reduction", "session.audio.input.noise_reduction", "nr")
    assert "pyrnnoise" in error["message"]
    assert "session.updated" not in h.types()
    assert h.session.config == before
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"noise_reduction": None}}})
    assert h.types()[-1] == "session.updated"


def test_noise_reduction_denoises_before_vad_and_keeps_turns():
    """near_field with RNNoise installed: echoed, and a spoken-length tone in noise is still one turn."""
    from realtime_ming.audio.denoise import DenoiserUnavailable, rnnoise_library_path

    try:
        rnnoise_library_path()
    except DenoiserUnavailable:
        pytest.skip("RNNoise not installed (pip install --no-deps pyrnnoise)")
    h = _vad_harness()
    h.send(type="session.update", session={
        "type": "realtime", "audio": {"input": {"noise_reduction": {"type": "near_field"}}}})
    assert h.last("session.updated")["session"]["audio"]["input"]["noise_reduction"] == {"type": "near_field"}
    h.append(silence(0.5, MODEL_HZ))
    h.append(tone(0.6, MODEL_HZ))
    h.append(silence(1.0, MODEL_HZ))
    assert h.types().count("input_audio_buffer.speech_stopped") == 1
    assert h.types().count("input_audio_buffer.committed") == 1


def _idle_harness(timeout_ms: int) -> Harness:
    h = _vad_harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "idle_timeout_ms": timeout_ms}}}})
    return h


def test_idle_timeout_after_playback_prompts_the_user():
    """GA idle_timeout_ms: counted from the end of the reply's playback on the input clock; then
    timeout_triggered, the idle input committed as a user item, and a new response."""
    h = _idle_harness(1000)
    turn_id = _vad_response(h)  # the reply so far: 0.2 s of audio
    h.finish_turn(turn_id, pcm=_engine_pcm(0.3))  # 0.5 s of audio in all
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
    turn_id = _vad_response(h)
    h.finish_turn(turn_id)
    h.append(silence(0.5, MODEL_HZ))
    h.append(tone(0.6, MODEL_HZ))
    h.append(silence(2.5, MODEL_HZ))
    assert "input_audio_buffer.timeout_triggered" not in h.types()
    h = _vad_harness()
    turn_id = _vad_response(h)
    h.finish_turn(turn_id)
    h.append(silence(5.0, MODEL_HZ))
    assert "input_audio_buffer.timeout_triggered" not in h.types()
