"""Remote MCP tools end to end on loopback (issue 47): the real server with the embedded tiny model (CPU) whose
thinker plays a forced call then an answer, and a real MCP server (the mcp package's MCPServer, streamable HTTP)
with tools; a raw GA client validates every frame against the openai package's GA server-event union."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mcp_support import free_port, loopback_mcp, redirecting
from server_support import WsClient, espeak, silence
from websockets.asyncio.client import connect

from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer, load_config

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "It is sunny in Paris."
FORCED = CALL + "<|role_end|>" + ANSWER + "<|role_end|>"


@pytest.fixture(scope="module")
def forced_engine():
    from realtime_ming.engine import Engine
    from realtime_ming.engine.config import EngineConfig, ThinkerRunnerConfig
    from realtime_ming.engine.hooks import EngineHooks

    eng = Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(max_seq_len=2048)),
                        hooks=EngineHooks(forced_reply=FORCED))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def mcp_server():
    with loopback_mcp() as srv:
        yield srv


@pytest.fixture
async def server(forced_engine):
    cfg = load_config(None, ["server.port=0", "server.mcp.allowed_hosts=[127.0.0.1]", "server.mcp.timeout_s=3",
                             "server.mcp.max_response_bytes=8192"])
    async with RealtimeServer(cfg, forced_engine) as srv:
        yield srv


async def _client(port: int) -> WsClient:
    ws = await connect(f"ws://127.0.0.1:{port}/v1/realtime?model=ming")
    client = WsClient(ws, Dialect.GA)
    client.allow_opt_in = True
    assert (await client.recv())["type"] == "session.created"
    return client


async def _configure(client: WsClient, url: str, approval="never", **session) -> list[dict]:
    await client.send(type="session.update", session={
        "type": "realtime", "output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}, **session,
        "tools": [{"type": "mcp", "server_label": "tools", "server_url": url, "require_approval": approval,
                   "headers": {"X-Test": "yes"}, "allowed_tools": ["get_weather", "add"]}]})
    return await client.recv_until(("mcp_list_tools.completed", "mcp_list_tools.failed"), timeout=30)


async def _ask(client: WsClient) -> None:
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]})
    await client.send(type="response.create", response={"tool_choice": "required"})


async def test_lists_and_calls_a_tool_then_answers_from_it(server, mcp_server):
    client = await _client(server.port)
    frames = await _configure(client, mcp_server.url)
    listed = next(f for f in frames if f["type"] == "conversation.item.done")["item"]
    assert listed["type"] == "mcp_list_tools" and {t["name"] for t in listed["tools"]} == {"get_weather", "add"}
    before = len(mcp_server.calls)
    await _ask(client)
    frames = await client.recv_until("response.done", timeout=120)
    types = [f["type"] for f in frames]
    assert types.index("response.mcp_call_arguments.done") < types.index("response.mcp_call.in_progress") < \
        types.index("response.mcp_call.completed") < types.index("response.done")
    done = frames[-1]["response"]
    call = next(o for o in done["output"] if o["type"] == "mcp_call")
    assert json.loads(call["arguments"]) == {"city": "Paris"} and call["output"] == "sunny in Paris"
    assert mcp_server.calls[before:] == [("get_weather", {"city": "Paris"})]
    # the server's follow-up response answers from the result
    frames = await client.recv_until("response.done", timeout=120)
    assert frames[-1]["response"]["status"] == "completed"
    assert next(f for f in frames if f["type"] == "response.output_text.done")["text"] == ANSWER
    await client.ws.close()


@pytest.mark.parametrize("approve", [True, False])
async def test_approval_required_then_approved_or_denied(server, mcp_server, approve):
    client = await _client(server.port)
    await _configure(client, mcp_server.url, approval="always")
    before = len(mcp_server.calls)
    await _ask(client)
    frames = await client.recv_until("response.done", timeout=120)
    request = next(o for o in frames[-1]["response"]["output"] if o["type"] == "mcp_approval_request")
    assert request["name"] == "get_weather" and mcp_server.calls[before:] == []
    await client.send(type="conversation.item.create", item={
        "type": "mcp_approval_response", "approval_request_id": request["id"], "approve": approve})
    if approve:
        frames = await client.recv_until("response.mcp_call.completed", timeout=30)
        call = next(f["item"] for f in frames if f["type"] == "conversation.item.added" and f["item"]["type"] == "mcp_call")
        assert call["approval_request_id"] == request["id"]
        assert mcp_server.calls[before:] == [("get_weather", {"city": "Paris"})]
        frames = await client.recv_until("response.done", timeout=120)
        assert frames[-1]["response"]["status"] == "completed"
    else:
        await client.recv_until("conversation.item.done")
        await client.send(type="response.create", response={"tool_choice": "none"})
        await client.recv_until("response.done", timeout=120)
        assert mcp_server.calls[before:] == []
    await client.ws.close()


async def test_dead_and_slow_servers_fail_the_call_not_the_session(server):
    client = await _client(server.port)
    frames = await _configure(client, f"http://127.0.0.1:{free_port()}/mcp")  # nothing listens there
    assert frames[-1]["type"] == "mcp_list_tools.failed"
    error = await client.recv_until("error")
    assert error[-1]["error"]["code"] == "mcp_list_tools_failed"
    # a slow tool: the call fails after server.mcp.timeout_s, the response ends, the session goes on
    with loopback_mcp(slow_s=20.0) as slow:
        await _slow_call(client, slow.url)
    await client.ws.close()


async def _slow_call(client: WsClient, url: str) -> None:
    await client.send(type="session.update", session={"type": "realtime", "tools": [{
        "type": "mcp", "server_label": "slow", "server_url": url, "require_approval": "never"}]})
    await client.recv_until("mcp_list_tools.completed", timeout=30)
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Slow?"}]})
    await client.send(type="response.create", response={"tool_choice": "required"})
    frames = await client.recv_until("response.done", timeout=120)
    assert "response.mcp_call.failed" in [f["type"] for f in frames]
    call = next(o for o in frames[-1]["response"]["output"] if o["type"] == "mcp_call")
    assert call["error"]["type"] == "http_error" and "timeout_s" in call["error"]["message"]
    await client.send(type="session.update", session={"type": "realtime", "instructions": "still here"})
    assert (await client.recv_until("session.updated"))[-1]["session"]["instructions"] == "still here"


async def test_a_host_not_allowed_is_refused(server):
    client = await _client(server.port)
    await client.send(type="session.update", event_id="u1", session={"type": "realtime", "tools": [{
        "type": "mcp", "server_label": "x", "server_url": "http://localhost:1/mcp"}]})
    error = (await client.recv_until("error"))[-1]["error"]
    assert error["code"] == "mcp_server_not_allowed" and "'localhost'" in error["message"]
    await client.ws.close()


async def test_a_spoken_turn_lists_and_calls_a_tool_then_answers(server, mcp_server, tmp_path):
    """espeak-ng speech through input_audio_buffer with server VAD: the turn's response (tool_choice required
    in the session) calls the listed MCP tool, and the follow-up response answers from its result."""
    client = await _client(server.port)
    await _configure(client, mcp_server.url, tool_choice="required",
                     audio={"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}})
    before = len(mcp_server.calls)
    await client.append_audio(np.concatenate([espeak("What is the weather in Paris?", tmp_path), silence(1.5)]))
    frames = await client.recv_until("response.done", timeout=120)
    types = [f["type"] for f in frames]
    assert types.index("input_audio_buffer.speech_stopped") < types.index("input_audio_buffer.committed") < \
        types.index("response.created") < types.index("response.mcp_call.completed")
    call = next(o for o in frames[-1]["response"]["output"] if o["type"] == "mcp_call")
    assert call["name"] == "get_weather" and call["output"] == "sunny in Paris"
    assert mcp_server.calls[before:] == [("get_weather", {"city": "Paris"})]
    frames = await client.recv_until("response.done", timeout=120)
    assert frames[-1]["response"]["status"] == "completed"
    assert next(f for f in frames if f["type"] == "response.output_text.done")["text"] == ANSWER
    await client.ws.close()


async def test_a_result_over_max_response_bytes_fails_the_call_not_the_session(server):
    """A tool whose result is larger than server.mcp.max_response_bytes: the mcp_call item fails with
    http_error 413 naming the bound, the response completes, the session goes on."""
    client = await _client(server.port)
    with loopback_mcp(pad=20000) as big:
        await _configure(client, big.url)
        await _ask(client)
        frames = await client.recv_until("response.done", timeout=120)
    assert "response.mcp_call.failed" in [f["type"] for f in frames]
    assert frames[-1]["response"]["status"] == "completed"
    call = next(o for o in frames[-1]["response"]["output"] if o["type"] == "mcp_call")
    assert call["error"]["type"] == "http_error" and call["error"]["code"] == 413
    assert "8192" in call["error"]["message"] and "max_response_bytes" in call["error"]["message"]
    await client.send(type="session.update", session={"type": "realtime", "instructions": "still here"})
    assert (await client.recv_until("session.updated", timeout=120))[-1]["session"]["instructions"] == "still here"
    await client.ws.close()


async def test_a_redirect_to_a_host_not_allowed_is_refused(server, mcp_server):
    """An allowed host that redirects to one not listed (another name of the same MCP server): the redirect is
    not followed, the listing fails with an error naming the refused host, the session goes on."""
    client = await _client(server.port)
    with redirecting(f"http://localhost:{mcp_server.port}/mcp") as (redirector, url):
        frames = await _configure(client, url)
        assert frames[-1]["type"] == "mcp_list_tools.failed"
        error = (await client.recv_until("error"))[-1]["error"]
        assert redirector.hits == 1
    assert error["code"] == "mcp_list_tools_failed"
    assert "'localhost'" in error["message"] and "server.mcp.allowed_hosts" in error["message"]
    await client.send(type="session.update", session={"type": "realtime", "instructions": "still here"})
    assert (await client.recv_until("session.updated"))[-1]["session"]["instructions"] == "still here"
    await client.ws.close()
