"""SDK pieces without an engine: server-event parsing, URLs, backoff, audio encoding, the calls' wire form.

Parsing is checked against `protocol.serialise` (every sample event of the protocol tests, both
dialects, must come back to the identical wire object); the calls are checked on an agent whose
transport records the client events it would send.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import pytest
import soundfile as sf
from PIL import Image
from protocol_samples_support import ALL_SAMPLES

from realtime_ming.audio.pcm import float_to_pcm16
from realtime_ming.audio.resample import resample, resampled_length
from realtime_ming.protocol import (
    PLAYOUT_SERVER_TYPES,
    CLIENT_EVENTS,
    AudioFormat,
    ClientEvent,
    Dialect,
    Modality,
    ResponseCreated,
    ResponseDone,
    ResponseOutputAudioDelta,
    ResponseOutputAudioTranscriptDelta,
    ResponseOutputAudioTranscriptDone,
    ResponseStatus,
    ServerEvent,
    ServerVad,
    event_to_wire,
    parse,
)
from realtime_ming.protocol import Response as WireResponse
from realtime_ming.sdk import (
    AgentOptions,
    ProtocolViolation,
    RealtimeAgent,
    ReconnectPolicy,
    parse_server_event,
    realtime_url,
)
from realtime_ming.sdk.audio import encode_input_audio
from realtime_ming.sdk.turn import TurnCollector

# `output_audio_buffer.*` exist on GA connections only (WebRTC, or a WebSocket session that asked for them)
ROUNDTRIP = [(name, event, dialect) for name, event in ALL_SAMPLES for dialect in Dialect
             if dialect is Dialect.GA or name not in PLAYOUT_SERVER_TYPES]


@pytest.mark.parametrize(("name", "event", "dialect"), ROUNDTRIP,
                         ids=[f"{n}-{d.value}-{i}" for i, (n, _, d) in enumerate(ROUNDTRIP)])
def test_parse_server_event_inverts_serialise(name: str, event: ServerEvent, dialect: Dialect) -> None:
    """Every serialised sample event parses to the same class and re-serialises to the identical wire object."""
    wire = event_to_wire(event, dialect, timing_events=True, playout=True)
    if wire is None:  # beta drops conversation.item.done
        return
    parsed = parse_server_event(json.dumps(wire), dialect)
    assert type(parsed) is type(event)
    again = event_to_wire(parsed, dialect, timing_events=True, playout=True)
    assert again is not None
    assert {**again, "event_id": wire["event_id"]} == wire


def test_parse_server_event_maps_beta_names_to_ga_classes() -> None:
    """A beta `response.audio.delta` frame becomes a ResponseOutputAudioDelta; GA rejects that name."""
    frame = {"type": "response.audio.delta", "response_id": "r", "item_id": "i", "output_index": 0,
             "content_index": 0, "delta": "AAAA"}
    event = parse_server_event(frame, Dialect.BETA)
    assert event == ResponseOutputAudioDelta(response_id="r", item_id="i", output_index=0, content_index=0,
                                             delta="AAAA")
    with pytest.raises(ProtocolViolation, match="unknown server event type 'response.audio.delta' \\(ga\\)"):
        parse_server_event(frame, Dialect.GA)


@pytest.mark.parametrize(("frame", "message"), [
    ("{oops", "server frame is not JSON"),
    ("[1, 2]", "not an object with a string 'type'"),
    ('{"type": "response.bogus"}', "unknown server event type 'response.bogus'"),
    ('{"type": "conversation.item.deleted"}', "malformed conversation.item.deleted event: Invalid event: missing"),
    ('{"type": "conversation.item.deleted", "item_id": 3}', "'item_id' must be a string, got an integer"),
    ('{"type": "response.done", "response": {"id": "r", "status": "paused", "audio": {"output": {"voice": "v"}}}}',
     "'paused' is not one of"),
])
def test_parse_server_event_rejects_non_events(frame: str, message: str) -> None:
    """Frames that are not server events raise ProtocolViolation naming the problem and keeping the frame."""
    with pytest.raises(ProtocolViolation, match=message.replace("(", "\\(").replace(")", "\\)")) as info:
        parse_server_event(frame)
    assert info.value.frame == frame


@pytest.mark.parametrize(("url", "model", "expected"), [
    ("ws://h:1/v1/realtime", None, "ws://h:1/v1/realtime"),
    ("http://h:1", "ming", "ws://h:1/v1/realtime?model=ming"),
    ("https://h/v1/", None, "wss://h/v1/realtime"),
    ("wss://h/custom/path?model=a", "b", "wss://h/custom/path?model=a"),
])
def test_realtime_url_normalises(url: str, model: str | None, expected: str) -> None:
    """http(s) becomes ws(s), a bare host or /v1 base gains /realtime, the model joins the query once."""
    assert realtime_url(url, model) == expected


def test_realtime_url_rejects_other_schemes() -> None:
    """Only ws, wss, http and https URLs are accepted."""
    with pytest.raises(ValueError, match="unsupported URL scheme 'ftp'"):
        realtime_url("ftp://h/v1/realtime")


def test_reconnect_policy_backoff_grows_and_caps() -> None:
    """Backoff doubles from initial_backoff_s up to max_backoff_s, within ± jitter."""
    policy = ReconnectPolicy(initial_backoff_s=0.5, max_backoff_s=3.0, multiplier=2.0, jitter=0.1)
    for attempt, base in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (9, 3.0)]:
        assert base * 0.9 <= policy.backoff_s(attempt) <= base * 1.1
    assert ReconnectPolicy(jitter=0.0, initial_backoff_s=0.25).backoff_s(3) == 1.0
    with pytest.raises(ValueError, match="max_attempts"):
        ReconnectPolicy(max_attempts=0)


def test_encode_input_audio_resamples_arrays_and_files(tmp_path) -> None:
    """float/int16 arrays and files are resampled to the format's rate and PCM16-encoded; bytes pass through."""
    t = np.arange(16000) / 16000
    int16 = np.round(8192 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)
    tone = int16.astype(np.float32) / 32768  # exactly the int16 and 16-bit file inputs below
    fmt = AudioFormat()  # PCM16 24 kHz
    from_float = encode_input_audio(tone, fmt, 16000)
    assert from_float == float_to_pcm16(resample(tone, 16000, 24000))
    assert len(from_float) == 2 * resampled_length(16000, 16000, 24000)
    assert encode_input_audio(int16, fmt, 16000) == from_float
    stereo = np.stack([tone, tone], axis=1)
    assert encode_input_audio(stereo, fmt, 16000) == from_float
    path = tmp_path / "tone.flac"
    sf.write(path, int16, 16000, subtype="PCM_16")
    assert encode_input_audio(path, fmt) == from_float
    assert encode_input_audio(b"\x01\x02\x03\x04", fmt) == b"\x01\x02\x03\x04"
    with pytest.raises(ValueError, match="not a whole number"):
        encode_input_audio(b"\x01\x02\x03", fmt)
    with pytest.raises(TypeError, match="float or int16"):
        encode_input_audio(np.zeros(4, dtype=np.int32), fmt)
    assert len(encode_input_audio(tone, AudioFormat.pcmu(), 16000)) == resampled_length(16000, 16000, 8000)


class RecordingAgent(RealtimeAgent):
    """A RealtimeAgent whose transport records each client event as the wire object it would send."""

    def __init__(self, dialect: Dialect = Dialect.GA) -> None:
        super().__init__(dialect, AgentOptions())
        self.sent: list[dict] = []

    async def _transmit(self, event: ClientEvent) -> None:
        wire = event.to_wire(self.dialect)
        parsed = parse(json.dumps(wire), self.dialect)  # what the server would read
        assert isinstance(parsed, CLIENT_EVENTS[wire["type"]]), parsed
        self.sent.append(wire)

    async def close(self) -> None:
        pass


async def test_update_session_sends_only_the_given_fields() -> None:
    """update_session sends a partial GA session.update; turn_detection=None is sent as null."""
    agent = RecordingAgent()
    await agent.update_session(output_modalities="text", output_format=44100, turn_detection=None, voice="DB30")
    assert agent.sent == [{"type": "session.update", "session": {
        "type": "realtime", "output_modalities": ["text"],
        "audio": {"input": {"turn_detection": None}, "output": {"format": {"type": "audio/pcm", "rate": 44100},
                                                                "voice": "DB30"}}}}]


async def test_update_session_refuses_fields_the_dialect_cannot_carry() -> None:
    """GA has no temperature and beta no 44.1 kHz PCM: both raise ValueError before sending."""
    with pytest.raises(ValueError, match="temperature cannot be set on a ga connection"):
        await RecordingAgent(Dialect.GA).update_session(temperature=0.7)
    with pytest.raises(ValueError, match="beta dialect cannot express 44100 Hz"):
        await RecordingAgent(Dialect.BETA).update_session(output_format=44100)
    beta = RecordingAgent(Dialect.BETA)
    await beta.update_session(temperature=0.7, turn_detection=ServerVad(silence_duration_ms=300))
    assert beta.sent[0]["session"]["temperature"] == 0.7


async def test_send_audio_chunks_in_the_session_input_format() -> None:
    """send_audio appends 200 ms chunks whose bytes concatenate to the encoded input; an input_format change applies."""
    agent = RecordingAgent()
    tone = np.linspace(-0.5, 0.5, 24000, dtype=np.float32)
    assert await agent.send_audio(tone) == 1.0
    chunks = [base64.b64decode(w["audio"]) for w in agent.sent]
    assert [len(c) for c in chunks] == [9600] * 5
    assert b"".join(chunks) == float_to_pcm16(tone)
    await agent.update_session(input_format=16000)
    assert await agent.send_audio(tone, sample_rate_hz=24000) == 1.0
    assert agent.sent[5]["type"] == "session.update"
    assert sum(len(base64.b64decode(w["audio"])) for w in agent.sent[6:]) == 2 * 16000


async def test_send_audio_realtime_paces_at_the_wall_clock() -> None:
    """With realtime=True, 100 ms of audio goes out as five 20 ms appends over at least 100 ms."""
    agent = RecordingAgent()
    loop = asyncio.get_running_loop()
    start = loop.time()
    await agent.send_audio(np.zeros(2400, dtype=np.float32), realtime=True)
    assert loop.time() - start >= 0.1
    assert [len(base64.b64decode(w["audio"])) for w in agent.sent] == [960] * 5


async def test_add_image_and_text_build_user_messages() -> None:
    """add_image sends a PNG data URL of the array plus the text; add_text a user text item; ids are returned."""
    agent = RecordingAgent()
    picture = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    image_id = await agent.add_image(picture, text="what is it?", detail="low")
    text_id = await agent.add_text("hi", previous_item_id=image_id)
    image_event, text_event = agent.sent
    assert image_event["item"]["id"] == image_id and image_id.startswith("item_")
    image_part, text_part = image_event["item"]["content"]
    assert image_part["detail"] == "low" and text_part == {"type": "input_text", "text": "what is it?"}
    prefix = "data:image/png;base64,"
    assert image_part["image_url"].startswith(prefix)
    decoded = Image.open(io.BytesIO(base64.b64decode(image_part["image_url"][len(prefix):])))
    assert np.array_equal(np.asarray(decoded), picture)
    assert text_event == {"type": "conversation.item.create", "previous_item_id": image_id, "item": {
        "type": "message", "object": "realtime.item", "id": text_id, "role": "user",
        "content": [{"type": "input_text", "text": "hi"}]}}


async def test_create_response_cancel_truncate_wire_form() -> None:
    """create_response, cancel and truncate send the documented client events."""
    agent = RecordingAgent()
    await agent.create_response(output_modalities=[Modality.TEXT], max_output_tokens=20, out_of_band=True,
                                input=["item_1"], metadata={"k": "v"})
    await agent.cancel("resp_1")
    await agent.truncate("item_2", 1234.9)
    assert agent.sent == [
        {"type": "response.create", "response": {"conversation": "none", "metadata": {"k": "v"},
                                                   "input": [{"type": "item_reference", "id": "item_1"}],
                                                   "output_modalities": ["text"], "max_output_tokens": 20}},
        {"type": "response.cancel", "response_id": "resp_1"},
        {"type": "conversation.item.truncate", "item_id": "item_2", "content_index": 0, "audio_end_ms": 1234},
    ]


def test_turn_collector_follows_one_response() -> None:
    """The collector keeps the first response's transcript and audio, ignores others, and times from its origin."""
    ids = {"response_id": "r1", "item_id": "i1", "output_index": 0, "content_index": 0}
    audio_format = AudioFormat(sample_rate_hz=16000)
    created = ResponseCreated(response=WireResponse(id="r1", voice="v", output_format=audio_format))
    samples = np.array([0.5, -0.25, 0.0], dtype=np.float32)
    delta = base64.b64encode(float_to_pcm16(samples)).decode()
    other = ResponseOutputAudioDelta(**{**ids, "response_id": "r0"}, delta=delta)
    done = ResponseDone(response=WireResponse(id="r1", voice="v", status=ResponseStatus.COMPLETED))
    collector = TurnCollector(10.0, AudioFormat(), expect_timings=False)
    events: list[ServerEvent] = [
        created, other, ResponseOutputAudioTranscriptDelta(**ids, delta="Hi"),
        ResponseOutputAudioDelta(**ids, delta=delta), ResponseOutputAudioDelta(**ids, delta=delta),
        ResponseOutputAudioTranscriptDone(**ids, transcript="Hi!"), done,
    ]
    for step, event in enumerate(events):
        assert not collector.is_complete
        collector.add(event, 10.0 + step)
    assert collector.is_complete
    turn = collector.result()
    assert (turn.response_id, turn.status, turn.text, turn.sample_rate_hz) == ("r1", ResponseStatus.COMPLETED, "Hi!", 16000)
    assert np.array_equal(turn.audio, np.concatenate([samples, samples]))
    assert (turn.timings.response_created_s, turn.timings.first_text_s, turn.timings.first_audio_s,
            turn.timings.done_s) == (0.0, 2.0, 3.0, 6.0)
    assert turn.events == tuple(events)

