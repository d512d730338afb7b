"""A speculative reply confirmed after a long turn decision, through the real server (tiny CPU engine, loopback).

server_vad with a 2 s silence_duration_ms is a forced long decision (the semantic_vad fallback of eagerness high):
the reply is submitted at the first 120 ms pause and confirmed 2 s later. Before the speculation bound the engine
meanwhile generated the whole reply, and its held events, released at once as 40 ms frames, overflowed the
connection's outbound cap (1008 "client is not reading"). Here the cap is lowered to 64 frames, so a flood of
any real size fails the test; the reply must arrive complete on an open connection and the item's audio
bookkeeping (retrieve, truncate) must match the bytes sent exactly. Unpaced (`output_lead_ms: null`) the held audio
goes as one backlog delta; paced (the default) it goes in frames the listener's clock lets out, none over a frame.
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from conftest import tiny_engine_fixture
from server_support import WsClient, silence

from bench.end_of_turn import espeak
from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer, load_config

pytestmark = [pytest.mark.realtime, pytest.mark.slow, pytest.mark.timeout(120)]

REPLY = " ".join(["The sea is wide and deep and full of quiet light."] * 4)
engine = tiny_engine_fixture(forced_reply=REPLY + "<|role_end|>")
MAX_OUTBOUND_EVENTS = 64
WIRE_HZ = 24000


@pytest.fixture
async def capped_server(engine):
    cfg = load_config(None, ["server.port=0", f"server.limits.max_outbound_events={MAX_OUTBOUND_EVENTS}"])
    async with RealtimeServer(cfg, engine) as srv:
        yield srv


@pytest.mark.parametrize("lead_ms", [None, "default"])
async def test_reply_confirmed_after_a_2s_decision_arrives_whole_on_an_open_connection(capped_server, lead_ms):
    from websockets.asyncio.client import connect

    ws = await connect(f"ws://127.0.0.1:{capped_server.port}/v1/realtime?model=ming", max_size=None)  # retrieve: all audio
    client = WsClient(ws, Dialect.GA)
    assert (await client.recv())["type"] == "session.created"
    session = {"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "silence_duration_ms": 2000}}}}
    if lead_ms is None:
        session["realtime_ming"] = {"output_lead_ms": None}
    await client.send(type="session.update", session=session)
    await client.recv_until("session.updated")
    await client.append_audio(np.concatenate([espeak("Tell me about the sea.", "en-us"), silence(0.4)]))
    await asyncio.sleep(2.5)  # the decision waits: the speculative reply runs (and is paused) meanwhile
    await client.append_audio(silence(2.0))
    frames = await client.recv_until("response.done", timeout=90)
    types = [f["type"] for f in frames]
    assert types.count("response.created") == 1
    done = frames[-1]["response"]
    assert done["status"] == "completed", done
    response_id = done["id"]
    deltas = [f["delta"] for f in frames if f["type"] == "response.output_audio.delta"]
    transcript = "".join(f["delta"] for f in frames if f["type"] == "response.output_audio_transcript.delta")
    assert transcript == done["output"][0]["content"][0]["transcript"] and transcript.strip() == REPLY
    audio = b"".join(base64.b64decode(d) for d in deltas)
    delta_ms = [len(base64.b64decode(d)) / 2 / WIRE_HZ * 1000 for d in deltas]
    first_ms = delta_ms[0]
    if lead_ms is None:
        assert first_ms > 40  # the held audio came as one backlog delta, not as 40 ms frames
    else:
        assert max(delta_ms) <= 40 + 1e-6  # paced: frame by frame as the listener plays, no backlog burst
    assert len(audio) / 2 / WIRE_HZ > 3.0  # the whole reply was spoken, not just its held lookahead
    item_id = done["output"][0]["id"]
    # the connection is open and the item holds exactly the audio sent
    await client.send(type="conversation.item.retrieve", item_id=item_id)
    item = (await client.recv_until("conversation.item.retrieved"))[-1]["item"]
    assert base64.b64decode(item["content"][0]["audio"]) == audio
    cut_ms = int(first_ms * 0.5)  # inside the backlog delta
    await client.send(type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=cut_ms)
    assert (await client.recv_until("conversation.item.truncated"))[-1]["audio_end_ms"] == cut_ms
    await client.send(type="conversation.item.retrieve", item_id=item_id)
    item = (await client.recv_until("conversation.item.retrieved"))[-1]["item"]
    assert base64.b64decode(item["content"][0]["audio"]) == audio[:cut_ms * WIRE_HZ // 1000 * 2]
    assert response_id
    await ws.close()
