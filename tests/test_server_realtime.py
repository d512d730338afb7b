"""End to end on loopback with the real engine (embedded tiny model, CPU) and real clients.

The openai SDK (GA and beta) drives spoken and text turns; espeak-ng speech is streamed in 20 ms
chunks at real time; noise must not start a turn; barge-in cancels a response and truncate trims
it; a client that vanishes mid-response leaves the engine with no turn. Every frame is validated
against the SDK's own server-event union for the connection's dialect.
"""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
from openai import AsyncOpenAI
from served_cli_support import served_cli
from server_support import (
    WsClient,
    assert_cancelled_by_speech,
    chunks,
    espeak,
    http_request,
    music_like_noise,
    pcm16_b64,
    seconds,
    silence,
    validate_frame,
    white_noise,
)
from websockets.asyncio.client import connect

from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer

pytestmark = [pytest.mark.realtime, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    """About 1.3 s of espeak-ng speech at 24 kHz."""
    return espeak("What time is it now?", tmp_path_factory.mktemp("speech"))


async def _paced(send, audio: np.ndarray) -> None:
    """Send `audio` in 20 ms appends at real time (the wall clock paces a live microphone)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i, piece in enumerate(chunks(audio, 20)):
        await send(pcm16_b64(piece))
        await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - loop.time()))


async def _raw_client(srv: RealtimeServer, dialect: Dialect = Dialect.GA) -> WsClient:
    ws = await connect(f"ws://127.0.0.1:{srv.port}/v1/realtime?model=ming")
    client = WsClient(ws, dialect)
    assert (await client.recv())["type"] == "session.created"
    return client


async def test_openai_sdk_completes_a_spoken_turn(server, speech):
    """openai GA client: real-time speech → speech_started/stopped/committed → audio deltas → response.done."""
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x")
    frames: list[dict] = []

    async def read_until_done(conn) -> None:
        while True:
            frame = json.loads(await conn.recv_bytes())
            validate_frame(frame, Dialect.GA)
            frames.append(frame)
            if frame["type"] == "response.done":
                return

    async with client.realtime.connect(model="ming") as conn:
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 16})
        reader = asyncio.create_task(read_until_done(conn))
        try:
            await _paced(lambda b64: conn.input_audio_buffer.append(audio=b64), np.concatenate([speech, silence(1.0)]))
            await asyncio.wait_for(asyncio.shield(reader), seconds(120))
        finally:
            reader.cancel()
    types = [f["type"] for f in frames]
    assert types[0] == "session.created"
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
             "input_audio_buffer.committed", "response.created", "response.output_audio.delta", "response.done"]
    positions = [types.index(t) for t in order]
    assert positions == sorted(positions)
    # the tiny random model rarely emits its end token: a max_output_tokens stop is a normal end here
    status = frames[-1]["response"]["status"]
    assert status == "completed" or (status == "incomplete"
                                     and frames[-1]["response"]["status_details"]["reason"] == "max_output_tokens")
    item_ids = {f["item_id"] for f in frames if f["type"].startswith("input_audio_buffer.")}
    assert len(item_ids) == 1
    _, _, body = await http_request(server.port, "/metrics")
    assert "realtime_ming_ttfa_seconds_count 1.0" in body.decode()


async def test_openai_beta_sdk_gets_beta_names(server):
    """openai beta client (websocket_base_url): a text turn answered with beta event names."""
    client = AsyncOpenAI(api_key="x", websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
    frames: list[dict] = []
    async with client.beta.realtime.connect(model="ming") as conn:
        await conn.session.update(session={"max_response_output_tokens": 8})
        await conn.conversation.item.create(item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello!"}]})
        await conn.response.create()
        async with asyncio.timeout(seconds(120)):
            while not frames or frames[-1]["type"] != "response.done":
                frame = json.loads(await conn.recv_bytes())
                validate_frame(frame, Dialect.BETA)
                frames.append(frame)
    types = {f["type"] for f in frames}
    assert {"session.created", "session.updated", "conversation.item.created", "response.created",
            "response.audio_transcript.done", "response.audio.done", "response.done"} <= types
    assert not types & {"conversation.item.added", "conversation.item.done", "response.output_audio.done"}


async def test_noise_starts_no_turn_but_speech_does(server, speech):
    """3 s of −40 dBFS white noise and 3 s of low music-like noise: no speech_started; speech: one."""
    client = await _raw_client(server)
    # Each noise starts from a reset detector (clear): the jump from one noise to the other is an
    # onset that Silero rightly scores as a sound event, and is not what is under test.
    for noise in (white_noise(-40, 3.0, seed=0), music_like_noise(-40, 3.0)):
        await client.append_audio(noise)
        await client.send(type="input_audio_buffer.clear")
        frames = await client.recv_until("input_audio_buffer.cleared")
        assert [f["type"] for f in frames] == ["input_audio_buffer.cleared"]
    await client.append_audio(np.concatenate([speech, silence(1.0)]))
    frames = await client.recv_until("input_audio_buffer.speech_stopped")
    assert [f["type"] for f in frames] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"]
    await client.ws.close()


async def test_barge_in_cancels_and_truncate_trims(server, speech):
    """Speech during a response: speech_started, response.done cancelled/turn_detected, no later deltas
    for it; truncating its item to what was heard is acknowledged and shortens its audio."""
    client = await _raw_client(server)
    delta = await client.start_long_response()
    response_id, item_id = delta["response_id"], delta["item_id"]
    await client.append_audio(np.concatenate([speech, silence(1.0)]))
    frames = await client.recv_until("input_audio_buffer.speech_stopped", timeout=60)
    after = frames[assert_cancelled_by_speech(frames, response_id) + 1:]
    assert not [f for f in after if f.get("response_id") == response_id]
    received = sum(len(base64.b64decode(f["delta"])) for f in client.frames
                   if f["type"] == "response.output_audio.delta" and f["response_id"] == response_id)
    heard_ms = min(received // 48, 100)
    await client.send(type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=heard_ms)
    await client.send(type="conversation.item.retrieve", item_id=item_id)
    frames = await client.recv_until("conversation.item.retrieved", timeout=60)
    truncated = next(f for f in frames if f["type"] == "conversation.item.truncated")
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (item_id, heard_ms)
    audio = base64.b64decode(frames[-1]["item"]["content"][0].get("audio") or "")
    assert len(audio) == heard_ms * 48
    await client.ws.close()


async def test_text_only_response(server):
    """output_modalities ["text"]: output_text deltas and no audio from the real engine."""
    client = await _raw_client(server)
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]})
    await client.send(type="response.create", response={"output_modalities": ["text"], "max_output_tokens": 8})
    frames = await client.recv_until("response.done", timeout=120)
    types = {f["type"] for f in frames}
    assert "response.output_text.done" in types
    assert not any(t.startswith("response.output_audio") for t in types)
    await client.ws.close()


async def test_killer_frames_leave_the_real_engine_serving(server):
    """The attack report's engine-killing frames (a lone surrogate in response instructions, user
    text, session instructions, an out-of-band input): one invalid_text each, and the real engine
    still answers this session and a concurrent one."""
    client, other = await _raw_client(server), await _raw_client(server)
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x\ud800"}]}
    killers = [
        ({"type": "response.create", "response": {"instructions": "x\ud800"}}, "response.instructions"),
        ({"type": "conversation.item.create", "item": user}, "item.content[0].text"),
        ({"type": "session.update", "session": {"type": "realtime", "instructions": "\udc00"}}, "session.instructions"),
        ({"type": "response.create", "response": {"conversation": "none", "input": [user]}},
         "response.input[0].content[0].text"),
    ]
    for i, (frame, param) in enumerate(killers):
        await client.ws.send(json.dumps({**frame, "event_id": f"evt_{i}"}))
        error = await client.expect_error("invalid_text")
        assert (error["param"], error["event_id"]) == (param, f"evt_{i}")
    for each in (other, client):
        await each.send(type="conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]})
        await each.send(type="response.create", response={"output_modalities": ["text"], "max_output_tokens": 8})
    for each in (other, client):
        done = (await each.recv_until("response.done", timeout=120))[-1]["response"]
        assert done["status"] in ("completed", "incomplete"), done
        await each.ws.close()


async def test_disconnect_mid_response_frees_the_engine_slot(server, engine):
    """A client vanishing mid-response: after its session ends the engine holds no turn, row or stream."""
    client = await _raw_client(server)
    await client.start_long_response()
    client.ws.transport.abort()
    await asyncio.wait_for(server.wait_idle(), seconds(10))
    stats = await asyncio.to_thread(engine.stats)
    assert (stats.turns, stats.thinker_rows, stats.talker_streams) == (0, 0, 0)


@pytest.mark.slow  # the full tier: the CLI in a server process
def test_cli_serve_starts_reports_and_stops():
    """`realtime-ming serve --port 0` prints the tiny-model notice and its URL, answers /health, exits 0 on SIGINT."""
    from realtime_ming.server import TINY_MODEL_NOTICE

    with served_cli() as server:
        assert server.url == f"ws://127.0.0.1:{server.port}/v1/realtime"
        assert TINY_MODEL_NOTICE in server.startup
        assert server.health()["status"] == "ok"
        assert server.stop() == 0
