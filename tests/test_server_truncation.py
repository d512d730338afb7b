"""`session.truncation` end to end: a real server (tiny model, CPU, a 256-token context) and a raw client.

With `auto` a conversation far longer than the context keeps answering and usage reports the
truncated prompt; with `disabled` the response fails with `context_length_exceeded` and the session
answers the next request that fits. Every frame validates against the openai package's GA union.
"""

from __future__ import annotations

import pytest
from conftest import tiny_engine_fixture
from server_support import WsClient
from websockets.asyncio.client import connect

from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer, load_config

pytestmark = pytest.mark.timeout(240)

MAX_SEQ_LEN = 256


engine = tiny_engine_fixture(max_seq_len=MAX_SEQ_LEN, max_slots=4)


@pytest.fixture
async def client(engine):
    async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as srv:
        ws = await connect(f"ws://127.0.0.1:{srv.port}/v1/realtime?model=ming")
        client = WsClient(ws, Dialect.GA)
        assert (await client.recv())["type"] == "session.created"
        yield client
        await ws.close()


async def _configure(client: WsClient, truncation) -> None:
    await client.send(type="session.update", session={
        "type": "realtime", "output_modalities": ["text"], "max_output_tokens": 4, "truncation": truncation,
        "audio": {"input": {"turn_detection": None}}})
    frames = await client.recv_until("session.updated")
    assert frames[-1]["session"]["truncation"] == truncation


async def _turn(client: WsClient, text: str) -> dict:
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await client.send(type="response.create")
    return (await client.recv_until("response.done", timeout=60))[-1]["response"]


@pytest.mark.slow
@pytest.mark.parametrize(("truncation", "turns"), [("auto", 200), ({"type": "retention_ratio", "retention_ratio": 0.6}, 50)])
async def test_a_session_far_past_the_context_keeps_answering(client, truncation, turns):
    await _configure(client, truncation)
    inputs = []
    for turn in range(turns):  # ~25 tokens per turn: the context is crossed around turn 8
        response = await _turn(client, f"User turn {turn}: please keep answering me.")
        assert response["status"] in ("completed", "incomplete"), response  # incomplete = max_output_tokens
        inputs.append(response["usage"]["input_tokens"])
    assert max(inputs) <= MAX_SEQ_LEN - 4  # usage counts the truncated prompt
    assert max(inputs) > MAX_SEQ_LEN // 2  # and the context was really full


async def test_disabled_fails_with_a_clear_code_and_the_session_survives(client):
    await _configure(client, "disabled")
    response = await _turn(client, " ".join(f"word{i}" for i in range(300)))
    assert response["status"] == "failed"
    assert response["status_details"]["error"]["code"] == "context_length_exceeded"
    # the conversation is still too long: delete the long item and the next request fits again
    long_item = next(f for f in client.frames if f["type"] == "conversation.item.done")["item"]["id"]
    await client.send(type="conversation.item.delete", item_id=long_item)
    await client.recv_until("conversation.item.deleted")
    response = await _turn(client, "short")
    assert response["status"] in ("completed", "incomplete"), response


async def test_invalid_truncation_values_are_rejected(client):
    for bad in ("sometimes", {"type": "retention_ratio", "retention_ratio": 1.5},
                {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 0}},
                {"type": "retention_ratio", "retention_ratio": 0.5, "extra": 1}):
        await client.send(type="session.update", session={"type": "realtime", "truncation": bad})
        error = await client.expect_error("invalid_value")
        assert error["param"].startswith("session.truncation")
