"""Out-of-band responses on loopback with the real engine (embedded tiny model, CPU), both dialects.

A spoken reply is generating when the client asks for a `conversation: "none"` text response: both
run, their events interleave on the one socket, each carries its own response id, both end with
`response.done` and real usage, and every frame validates against the openai package's server-event
union of the connection's dialect (tests/realtime_validate.py via `WsClient`).
"""

from __future__ import annotations

import asyncio

import pytest
from server_support import WsClient, seconds
from websockets.asyncio.client import connect

from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer

pytestmark = pytest.mark.timeout(240)

_NAMES = {
    Dialect.GA: ("response.output_audio.delta", "response.output_text.delta", ["text"], "output_modalities"),
    Dialect.BETA: ("response.audio.delta", "response.text.delta", ["text"], "modalities"),
}




async def _client(srv: RealtimeServer, dialect: Dialect) -> WsClient:
    path = "/v1/realtime?model=gpt-realtime" + ("" if dialect is Dialect.GA else "-beta")
    headers = {} if dialect is Dialect.GA else {"OpenAI-Beta": "realtime=v1"}
    client = WsClient(await connect(f"ws://127.0.0.1:{srv.port}{path}", additional_headers=headers), dialect)
    assert (await client.recv())["type"] == "session.created"
    return client


@pytest.mark.parametrize("dialect", list(Dialect))
async def test_out_of_band_text_response_beside_a_spoken_reply(server, dialect: Dialect):
    audio_delta, text_delta, text_only, modalities_key = _NAMES[dialect]
    client = await _client(server, dialect)
    limit = {"max_output_tokens": 4096} if dialect is Dialect.GA else {"max_response_output_tokens": 4096}
    await client.send(type="session.update", session={"type": "realtime", **limit} if dialect is Dialect.GA else limit)
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a long story."}]})
    await client.send(type="response.create")
    main_id = (await client.recv_until(audio_delta, timeout=120))[-1]["response_id"]
    # the tiny random model never stops by itself: the side response ends at its token limit
    oob_limit = {"max_output_tokens": 8} if dialect is Dialect.GA else {"max_response_output_tokens": 8}
    await client.send(type="response.create", response={
        "conversation": "none", modalities_key: text_only, "metadata": {"purpose": "summary"},
        "instructions": "Summarise the conversation in one word.", **oob_limit})
    done: dict[str, dict] = {}
    frames: list[dict] = []
    async with asyncio.timeout(seconds(180)):
        while len(done) < 2 or main_id not in done:
            frame = await client.recv(timeout=180)
            frames.append(frame)
            assert frame["type"] != "error", frame
            if frame["type"] == "response.done":
                done[frame["response"]["id"]] = frame["response"]
                if len(done) == 1 and main_id not in done:  # the side response ended first: stop the story
                    await client.send(type="response.cancel")
    (oob_id,) = set(done) - {main_id}
    oob = done[oob_id]
    assert (oob["status"], oob["status_details"]["reason"]) == ("incomplete", "max_output_tokens")
    assert oob["metadata"] == {"purpose": "summary"}
    assert oob["conversation_id"] is None and oob["usage"]["output_token_details"]["text_tokens"] == 8
    assert oob["usage"]["output_token_details"]["audio_tokens"] == 0
    oob_text = [f for f in frames if f["type"] == text_delta]
    assert oob_text and all(f["response_id"] == oob_id for f in oob_text)
    # the spoken reply kept streaming while the side response ran (interleaved on the one socket)
    first_oob, last_oob = frames.index(oob_text[0]), frames.index(oob_text[-1])
    main_between = [f for f in frames[:last_oob] if f.get("response_id") == main_id and f["type"] == audio_delta]
    assert main_between and any(f.get("response_id") == main_id for f in frames[first_oob:])
    assert not [f for f in frames if f.get("response_id") == oob_id and f["type"] == audio_delta]
    # only the main reply is part of the conversation
    added_type = "conversation.item.added" if dialect is Dialect.GA else "conversation.item.created"
    added = [f["item"]["id"] for f in client.frames if f["type"] == added_type]
    assert oob["output"][0]["id"] not in added and done[main_id]["output"][0]["id"] in added
    await client.ws.close()
