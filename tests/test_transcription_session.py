"""GA `transcription`-type sessions: they only transcribe committed audio and never respond.

Session level (the sans-I/O `Session`, every frame validated against the openai GA union), then the real
server with the tiny model and an espeak-ng turn cut by server VAD."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from server_support import WsClient, chunks, espeak, pcm16_b64, silence, tone
from session_support import MODEL_HZ, PCM16K, Harness
from websockets.asyncio.client import connect

from realtime_ming.engine.api import FinishReason, TextDelta, TurnDone, TurnTask
from realtime_ming.protocol import Dialect
from realtime_ming.protocol.decode import decode_server_event
from realtime_ming.protocol.session import SessionType

TRANSCRIBE = {"type": "transcription", "audio": {"input": {
    "format": PCM16K, "transcription": {"model": "gpt-4o-transcribe", "language": "en"}}}}
PREFIX = "conversation.item.input_audio_transcription"


def _transcription_session(turn_detection=None) -> Harness:
    h = Harness(Dialect.GA)
    session = {**TRANSCRIBE, "audio": {"input": {**TRANSCRIBE["audio"]["input"], "turn_detection": turn_detection}}}
    h.send(type="session.update", session=session)
    return h


def test_update_to_transcription_type_echoes_the_transcription_shape():
    h = _transcription_session()
    session = h.last("session.updated")["session"]
    assert session["type"] == "transcription"
    assert set(session) == {"type", "id", "object", "audio", "include"}  # no realtime-only field is reported
    assert set(session["audio"]) == {"input"}
    assert session["audio"]["input"]["transcription"] == {"model": "ming-test", "language": "en"}
    decoded = decode_server_event(h.frames[-1] | {"event_id": "e"}, Dialect.GA).session
    assert decoded.session_type is SessionType.TRANSCRIPTION and decoded.transcription.language == "en"


def test_committed_audio_is_transcribed_and_no_response_is_created():
    h = _transcription_session()
    h.append(tone(0.5, MODEL_HZ))
    h.send(type="input_audio_buffer.commit")
    item_id = h.last("input_audio_buffer.committed")["item_id"]
    (request,) = h.submitted()  # the ASR side turn only: nothing else runs
    assert request.task is TurnTask.TRANSCRIBE and not request.with_audio
    h.engine(TextDelta(request.turn_id, "hello"))
    h.engine(TurnDone(request.turn_id, "hello", FinishReason.STOP, 30, 0, 2, 0, {}))
    assert h.last(f"{PREFIX}.completed")["item_id"] == item_id
    assert not any(t.startswith("response.") for t in h.types())


def test_vad_turns_are_transcribed_without_speculative_or_real_replies():
    h = _transcription_session({"type": "server_vad", "silence_duration_ms": 200, "create_response": True})
    h.append(np.concatenate([silence(0.3, MODEL_HZ), tone(0.8, MODEL_HZ), silence(0.8, MODEL_HZ)]))
    assert "input_audio_buffer.speech_stopped" in h.types()
    assert [r.task for r in h.submitted()] == [TurnTask.TRANSCRIBE]
    assert not any(t.startswith("response.") for t in h.types())


def test_response_create_is_refused_with_a_clear_code_and_the_session_goes_on():
    h = _transcription_session()
    h.send(type="response.create", event_id="ev1")
    error = h.last("error")["error"]
    assert (error["code"], error["event_id"]) == ("transcription_session_no_response", "ev1")
    h.send(type="session.update", session={"type": "realtime"})  # back to a conversation: replies again
    assert h.last("session.updated")["session"]["type"] == "realtime"
    h.send(type="response.create")
    assert "response.created" in h.types()


@pytest.mark.parametrize(("session", "param"), [
    ({"type": "transcription", "instructions": "be brief"}, "session.instructions"),
    ({"type": "transcription", "audio": {"output": {"voice": "DB30"}}}, "session.audio.output.voice"),
    ({"type": "transcription", "tools": []}, "session.tools"),
    ({"type": "transcription", "output_modalities": ["text"]}, "session.output_modalities"),
])
def test_realtime_only_fields_are_refused_in_a_transcription_session(session, param):
    h = _transcription_session()
    h.send(type="session.update", session=session)
    error = h.last("error")["error"]
    assert (error["code"], error["param"]) == ("realtime_only_parameter", param)
    h.send(type="session.update", session={"instructions": "x"})  # no type: the session stays a transcription one
    assert h.last("error")["error"]["param"] == "session.instructions"
    assert h.session.config.session_type is SessionType.TRANSCRIPTION and h.session.config.instructions == ""


def test_idle_timeout_is_refused_in_a_transcription_session():
    """idle_timeout_ms prompts a reply after silence: a transcription session has none to prompt."""
    h = Harness(Dialect.GA)
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}}})
    h.send(type="session.update", session={"type": "transcription"})
    error = h.last("error")["error"]
    assert (error["code"], error["param"]) == ("realtime_only_parameter",
                                               "session.audio.input.turn_detection.idle_timeout_ms")
    assert h.session.config.session_type is SessionType.REALTIME


def test_transcription_cannot_be_turned_off_and_defaults_on():
    h = Harness(Dialect.GA)
    h.send(type="session.update", session={"type": "transcription"})
    assert h.last("session.updated")["session"]["audio"]["input"]["transcription"] == {"model": "ming-test"}
    h.send(type="session.update", session={"type": "transcription", "audio": {"input": {"transcription": None}}})
    error = h.last("error")["error"]
    assert (error["code"], error["param"]) == ("invalid_value", "session.audio.input.transcription")


def test_type_cannot_change_while_a_response_runs():
    h = Harness(Dialect.GA)
    h.send(type="response.create")
    h.send(type="session.update", session={"type": "transcription"})
    assert h.last("error")["error"]["code"] == "session_type_change_while_responding"
    assert h.session.config.session_type is SessionType.REALTIME


# ---- the real server ---------------------------------------------------------------------------------------


async def test_spoken_turn_in_a_transcription_session_is_transcribed_by_the_server(engine, tmp_path):
    from realtime_ming.server import RealtimeServer, load_config

    speech = espeak("Please book a table for two.", tmp_path)
    async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as server:
        ws = await connect(f"ws://127.0.0.1:{server.port}/v1/realtime?model=ming")
        client = WsClient(ws, Dialect.GA)  # validates every frame against the openai GA union
        await client.recv()
        await client.send(type="session.update", session={"type": "transcription", "audio": {"input": {
            "transcription": {"model": "gpt-4o-mini-transcribe", "language": "en"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}}})
        updated = (await client.recv_until("session.updated"))[-1]["session"]
        assert updated["type"] == "transcription"
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i, piece in enumerate(chunks(np.concatenate([speech, silence(1.0)]), 20)):
            await client.send(type="input_audio_buffer.append", audio=pcm16_b64(piece))
            await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - loop.time()))
        await client.recv_until(f"{PREFIX}.completed", timeout=120)
        await client.send(type="response.create", event_id="nope")
        error = (await client.recv_until("error"))[-1]["error"]
        assert (error["code"], error["event_id"]) == ("transcription_session_no_response", "nope")
        frames = client.frames
        (item_id,) = [f["item_id"] for f in frames if f["type"] == "input_audio_buffer.committed"]
        (completed,) = [f for f in frames if f["type"] == f"{PREFIX}.completed"]
        deltas = [f["delta"] for f in frames if f["type"] == f"{PREFIX}.delta" and f["item_id"] == item_id]
        assert completed["item_id"] == item_id and completed["transcript"] == "".join(deltas).strip()
        assert not any(f["type"].startswith("response.") for f in frames)
        await ws.close()
