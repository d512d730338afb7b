"""semantic_vad with the thinker's words judgement, through the real server (tiny CPU engine, espeak-ng speech).

Smart Turn (prosody) calls "I'd like to book a table for" complete at a 700 ms pause, so semantic_vad high splits
the sentence when prosody decides alone (today's behaviour, kept with the judgement off). With the judgement on
and forced to "not finished" (the `forced_turn_judgement` hook, for tests: the tiny model's own judgement is
noise) the same utterance gets exactly one response, after its end (the silence fallback ends it); forced
"finished", a complete question still ends at the first decision point. Audio is streamed in real time (20 ms
appends), as a client does: the judgement runs on the engine while the pause goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import asynccontextmanager

import numpy as np
import pytest
from server_support import WsClient, pcm16_b64, silence
from websockets.asyncio.client import connect

from bench.end_of_turn import espeak
from realtime_ming.audio import end_of_turn
from realtime_ming.engine import Engine
from realtime_ming.engine.config import EngineConfig, ThinkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer, load_config

pytestmark = [pytest.mark.realtime, pytest.mark.slow, pytest.mark.timeout(120)]
WIRE_HZ = 24000
HIGH = {"type": "semantic_vad", "eagerness": "high"}
PAUSED = ("I'd like to book a table for <p> four people at eight.", "en-us")


@pytest.fixture(autouse=True)
def patient_words(monkeypatch):
    """The tiny engine shares this host's 2 busy cores with the test: give the judgement 1.5 s (the policy's
    bounded wait; 200 ms by default) so the outcome never depends on the box's load."""
    high = end_of_turn.EAGERNESS_POLICY["high"]
    monkeypatch.setitem(end_of_turn.EAGERNESS_POLICY, "high", dataclasses.replace(high, words_wait_ms=1500))


@asynccontextmanager
async def judged_server(forced: float):
    engine = Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(turn_judgement="on")),
                           hooks=EngineHooks(forced_turn_judgement=forced))
    try:
        async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as srv:
            yield srv
    finally:
        engine.close()


async def _client(srv: RealtimeServer) -> WsClient:
    client = WsClient(await connect(f"ws://127.0.0.1:{srv.port}/v1/realtime?model=ming"), Dialect.GA)
    assert (await client.recv())["type"] == "session.created"
    await client.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": HIGH}}})
    await client.recv_until("session.updated")
    return client


async def _stream(client: WsClient, audio: np.ndarray) -> list[dict]:
    """Send `audio` in 20 ms appends at real-time pace while collecting every server frame; then 1 s more."""
    frames: list[dict] = []

    async def receive() -> None:
        while True:
            frames.append(await client.recv(60))

    reader = asyncio.create_task(receive())
    loop, step = asyncio.get_running_loop(), WIRE_HZ // 50
    t0 = loop.time()
    for i in range(0, audio.size, step):
        await asyncio.sleep(max(0.0, t0 + i / WIRE_HZ - loop.time()))
        await client.send(type="input_audio_buffer.append", audio=pcm16_b64(audio[i: i + step]))
    await asyncio.sleep(1.0)
    reader.cancel()
    return frames


def _count(frames: list[dict], event_type: str) -> int:
    return sum(f["type"] == event_type for f in frames)


async def test_words_not_finished_keep_a_paused_sentence_whole():
    speech = espeak(PAUSED[0], PAUSED[1], pause_ms=700)
    async with judged_server(0.05) as srv:
        client = await _client(srv)
        frames = await _stream(client, np.concatenate([speech, silence(2.4)]))
        await client.ws.close()
    assert _count(frames, "input_audio_buffer.speech_stopped") == 1, [f["type"] for f in frames]
    assert _count(frames, "response.created") == 1
    stopped = next(f for f in frames if f["type"] == "input_audio_buffer.speech_stopped")
    assert stopped["audio_end_ms"] >= speech.size * 1000 // WIRE_HZ  # after the sentence's end


async def _assert_complete_question_ends_at_the_first_decision_point(p_complete: float) -> None:
    """A complete question with the words judged `p_complete`: one turn, ended at the first decision point (not
    the 2 s fallback)."""
    speech = espeak("What time is it?", "en-us")
    lead = silence(0.3)
    async with judged_server(p_complete) as srv:
        client = await _client(srv)
        frames = await _stream(client, np.concatenate([lead, speech, silence(1.2)]))
        await client.ws.close()
    assert _count(frames, "input_audio_buffer.speech_stopped") == 1, [f["type"] for f in frames]
    assert _count(frames, "response.created") == 1
    stopped = next(f for f in frames if f["type"] == "input_audio_buffer.speech_stopped")
    speech_end_ms = (lead.size + speech.size) * 1000 // WIRE_HZ
    assert stopped["audio_end_ms"] - speech_end_ms <= 450, stopped


async def test_words_finished_end_a_complete_question_quickly():
    await _assert_complete_question_ends_at_the_first_decision_point(0.95)


async def test_judgement_off_keeps_prosody_alone(server):
    """The default tiny engine ("auto" = off for random weights): the same paused sentence splits on prosody."""
    speech = espeak(PAUSED[0], PAUSED[1], pause_ms=700)
    client = await _client(server)
    frames = await _stream(client, np.concatenate([speech, silence(2.4)]))
    await client.ws.close()
    assert _count(frames, "input_audio_buffer.speech_stopped") == 2, [f["type"] for f in frames]


async def test_sure_words_overrule_prosody_incomplete(monkeypatch):
    """Smart Turn made to call every pause incomplete (threshold 1): sure words (forced 0.95 >= high's
    `words_override`) still end a complete question at the first decision point, not after the 2 s fallback."""
    high = end_of_turn.EAGERNESS_POLICY["high"]
    assert high.words_override is not None and high.words_override <= 0.95
    monkeypatch.setitem(end_of_turn.EAGERNESS_POLICY, "high", dataclasses.replace(high, threshold=1.0))
    await _assert_complete_question_ends_at_the_first_decision_point(0.95)
