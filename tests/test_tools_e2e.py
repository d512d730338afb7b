"""Function calling end to end on loopback (issue 18): the real server, the real engine (embedded tiny model,
CPU) whose thinker plays a forced reply holding a Ming tool call and then an answer, and real clients —
a raw GA / beta WebSocket client (every frame validated against the openai package's unions) and the
openai-agents `RealtimeAgent` with a function tool. `tool_choice` required / named on the random model is
enforced by the forced call prefix."""

from __future__ import annotations

import asyncio
import json

import pytest
from server_support import WsClient, seconds
from websockets.asyncio.client import connect

from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer, load_config
from tools_support import ANSWER, CALL, _engine, forced_engine, server  # noqa: F401 - fixtures: the forced-reply engine and its server

pytestmark = pytest.mark.timeout(240)

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


async def _client(port: int, dialect: Dialect = Dialect.GA) -> WsClient:
    path = "/v1/realtime?model=ming" if dialect is Dialect.GA else "/v1/realtime?model=ming"
    headers = {} if dialect is Dialect.GA else {"OpenAI-Beta": "realtime=v1"}
    ws = await connect(f"ws://127.0.0.1:{port}{path}", additional_headers=headers)
    client = WsClient(ws, dialect)
    assert (await client.recv())["type"] == "session.created"
    return client


async def _ask(client: WsClient, text: str, **response) -> list[dict]:
    """The user says `text`, then one `response.create` (with `response` fields, if any): its frames to response.done."""
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await client.recv_until("conversation.item.added" if client.dialect is Dialect.GA else "conversation.item.created")
    await client.send(type="response.create", **({"response": response} if response else {}))
    return await client.recv_until("response.done", timeout=120)


async def test_ga_client_gets_a_function_call_and_the_answer_after_its_output(server):
    client = await _client(server.port)
    await client.send(type="session.update", session={"type": "realtime", "tools": [WEATHER], "tool_choice": "auto",
                                                      "audio": {"input": {"turn_detection": None}}})
    await client.recv_until("session.updated")
    frames = await _ask(client, "What's the weather in Paris?")
    types = [f["type"] for f in frames]
    added = [f for f in frames if f["type"] == "response.output_item.added" and f["item"]["type"] == "function_call"]
    assert len(added) == 1 and added[0]["item"]["name"] == "get_weather" and added[0]["output_index"] == 1
    call_id, item_id = added[0]["item"]["call_id"], added[0]["item"]["id"]
    deltas = "".join(f["delta"] for f in frames if f["type"] == "response.function_call_arguments.delta")
    done = next(f for f in frames if f["type"] == "response.function_call_arguments.done")
    assert json.loads(done["arguments"]) == {"city": "Paris"} and deltas == done["arguments"]
    assert (done["name"], done["call_id"], done["item_id"]) == ("get_weather", call_id, item_id)
    assert types.index("response.function_call_arguments.done") < types.index("response.done")
    item_done = [f for f in frames if f["type"] == "response.output_item.done" and f["item"]["type"] == "function_call"]
    assert item_done[0]["item"]["status"] == "completed" and item_done[0]["item"]["arguments"] == done["arguments"]
    # the call is never spoken: the transcript is the text before it
    transcript = next(f for f in frames if f["type"] == "response.output_audio_transcript.done")["transcript"]
    assert transcript == "Let me check. "
    response = frames[-1]["response"]
    assert response["status"] == "completed"
    assert [o["type"] for o in response["output"]] == ["message", "function_call"]
    assert response["output"][1]["call_id"] == call_id
    # the client runs the function and sends its output; the next response answers from it
    await client.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": call_id,
                                                             "output": json.dumps({"sky": "sunny"})})
    await client.recv_until("conversation.item.added")
    await client.send(type="response.create")
    frames = await client.recv_until("response.done", timeout=120)
    assert not any(f["type"].startswith("response.function_call") for f in frames)
    assert next(f for f in frames if f["type"] == "response.output_audio_transcript.done")["transcript"] == ANSWER
    assert frames[-1]["response"]["status"] == "completed"
    await client.ws.close()


async def test_beta_client_gets_beta_names_for_the_call(server):
    client = await _client(server.port, Dialect.BETA)
    await client.send(type="session.update", session={"tools": [WEATHER], "tool_choice": "get_weather",
                                                      "turn_detection": None, "modalities": ["text"]})
    await client.recv_until("session.updated")
    frames = await _ask(client, "Weather?")
    types = {f["type"] for f in frames}
    assert {"response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.output_item.added", "conversation.item.created"} <= types
    assert "conversation.item.added" not in types
    assert frames[-1]["response"]["output"][-1]["name"] == "get_weather"
    await client.ws.close()


async def test_tool_choice_naming_an_unknown_function_is_an_error(server):
    client = await _client(server.port)
    await client.send(type="session.update", event_id="e1", session={
        "type": "realtime", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "launch"}})
    frame = await client.recv()
    assert frame["type"] == "error" and frame["error"]["code"] == "tool_choice_unknown_function"
    assert frame["error"]["param"] == "session.tool_choice" and frame["error"]["event_id"] == "e1"
    # the session lives on, unchanged
    await client.send(type="session.update", session={"type": "realtime", "tool_choice": "none"})
    assert (await client.recv_until("session.updated"))[-1]["session"]["tool_choice"] == "none"
    await client.ws.close()


async def test_tool_choice_none_renders_no_tools_and_parses_no_call(server):
    client = await _client(server.port)
    await client.send(type="session.update", session={"type": "realtime", "tools": [WEATHER], "tool_choice": "none",
                                                      "output_modalities": ["text"],
                                                      "audio": {"input": {"turn_detection": None}}})
    await client.recv_until("session.updated")
    frames = await _ask(client, "Weather?")
    assert not any(f["type"].startswith("response.function_call") for f in frames)
    await client.ws.close()


async def test_openai_agents_realtime_agent_runs_the_tool_and_answers(server):
    """openai-agents 0.24 `RealtimeAgent`: the function tool runs with the model's arguments, its output
    goes back (function_call_output + response.create by the agent) and a follow-up response answers."""
    from agents import function_tool
    from agents.realtime import RealtimeAgent, RealtimeRunner

    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        calls.append(city)
        return f"sunny in {city}"

    agent = RealtimeAgent(name="weather", instructions="Answer briefly.", tools=[get_weather])
    runner = RealtimeRunner(agent, config={"model_settings": {"model_name": "ming", "turn_detection": None}})
    session = await runner.run(model_config={"url": f"ws://127.0.0.1:{server.port}/v1/realtime?model=ming",
                                             "api_key": "x"})
    seen: list[str] = []
    tool_output = None
    history: list = []
    async with session:
        await session.send_message("What's the weather in Paris?")
        async with asyncio.timeout(seconds(180)):
            async for event in session:
                seen.append(event.type)
                if event.type == "error":
                    raise AssertionError(f"agent error: {event.error}")
                if event.type == "tool_end":
                    tool_output = event.output
                if event.type == "history_updated":
                    history = event.history  # the agent's own record of the conversation
                if event.type == "agent_end" and tool_output is not None and seen.count("agent_end") >= 2:
                    break
    assert calls == ["Paris"] and tool_output == "sunny in Paris"
    assert seen.index("tool_start") < seen.index("tool_end")
    texts = [getattr(part, "transcript", None) or getattr(part, "text", None)
             for item in history if getattr(item, "role", None) == "assistant" for part in item.content]
    assert ANSWER in texts


@pytest.fixture(scope="module")
def random_engine():
    eng = _engine()
    yield eng
    eng.close()


async def test_required_tool_choice_makes_the_random_model_call(random_engine):
    """The tiny random model never writes a call by itself; `required` forces a call of one of the offered
    functions (the name constrained to theirs), a named choice forces that function."""
    get_time = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
    async with RealtimeServer(load_config(None, ["server.port=0"]), random_engine) as srv:
        client = await _client(srv.port)
        await client.send(type="session.update", session={
            "type": "realtime", "tools": [WEATHER, get_time], "output_modalities": ["text"], "max_output_tokens": 120,
            "audio": {"input": {"turn_detection": None}}})
        await client.recv_until("session.updated")
        frames = await _ask(client, "Weather?", tool_choice="auto")
        assert not any(f["type"] == "response.output_item.added" and f["item"]["type"] == "function_call"
                       for f in frames)
        await client.send(type="response.create", response={"tool_choice": "required"})
        frames = await client.recv_until("response.done", timeout=120)
        added = [f for f in frames
                 if f["type"] == "response.output_item.added" and f["item"]["type"] == "function_call"]
        assert len(added) == 1 and added[0]["item"]["name"] in ("get_weather", "get_time")
        assert added[0]["output_index"] == 0  # no empty assistant message before a forced call
        response = frames[-1]["response"]
        assert response["output"][0]["type"] == "function_call"
        if response["status"] == "failed":  # random argument text: malformed, a clear outcome
            assert response["status_details"]["error"]["code"] == "invalid_tool_call"
        await client.send(type="response.create", response={"tool_choice": {"type": "function", "name": "get_weather"}})
        frames = await client.recv_until("response.done", timeout=120)
        added = [f for f in frames if f["type"] == "response.output_item.added" and f["item"]["type"] == "function_call"]
        assert len(added) == 1 and added[0]["item"]["name"] == "get_weather"
        response = frames[-1]["response"]
        assert response["output"][-1]["type"] == "function_call"
        if response["status"] == "completed":
            json.loads(response["output"][-1]["arguments"])
        else:  # random argument text: malformed or cut, each a clear outcome
            assert response["output"][-1]["status"] == "incomplete"
            assert (response["status_details"].get("reason") == "max_output_tokens"
                    or response["status_details"]["error"]["code"] == "invalid_tool_call")
        await client.ws.close()


@pytest.mark.parametrize("transport", ["client", "local"])
async def test_sdk_tool_handler_runs_and_the_agent_answers(server, forced_engine, transport):
    """`agent.add_tool`: the SDK runs the handler on the model's call, sends its output and a new
    response.create; the follow-up response answers. Same over the socket and in process."""
    from realtime_ming.protocol.items import FunctionCallItem, FunctionCallOutputItem
    from realtime_ming.protocol.server_events import ResponseDone
    from realtime_ming.sdk import AgentOptions, LocalAgent, RealtimeClient

    got: list[tuple[str, str]] = []

    async def get_weather(city: str, unit: str = "celsius") -> dict:
        """The weather of a city."""
        got.append((city, unit))
        return {"city": city, "sky": "sunny"}

    if transport == "client":
        opening = RealtimeClient.connect(f"ws://127.0.0.1:{server.port}/v1/realtime", model="ming")
    else:
        opening = LocalAgent.start(forced_engine, options=AgentOptions())
    async with opening as agent:
        tool = await agent.add_tool(get_weather)
        assert tool.parameters == {"type": "object", "properties": {"city": {"type": "string"},
                                                                  "unit": {"type": "string"}}, "required": ["city"]}
        assert tool.description == "The weather of a city."
        await agent.update_session(turn_detection=None, output_modalities="text")
        await agent.add_text("What's the weather in Paris?")
        await agent.create_response()
        done: list[ResponseDone] = []
        async with asyncio.timeout(seconds(180)):
            async for event in agent:
                if isinstance(event, ResponseDone):
                    done.append(event)
                    if len(done) == 2:
                        break
        assert agent.session.tools[0].name == "get_weather"
    assert got == [("Paris", "celsius")]
    first, second = (d.response for d in done)
    call = first.output[-1]
    assert isinstance(call, FunctionCallItem) and call.name == "get_weather" and json.loads(call.arguments) == {
        "city": "Paris"}
    result = agent.tool_runner.results[0]
    assert result.call_id == call.call_id and json.loads(result.output) == {"city": "Paris", "sky": "sunny"}
    assert second.status.value == "completed" and second.output[0].content[0].text == ANSWER
    assert not any(isinstance(i, (FunctionCallItem, FunctionCallOutputItem)) for i in second.output)


async def test_a_call_of_an_unknown_function_fails_the_response_clearly(server):
    """The forced reply calls get_weather but the session only offers get_time: nothing is run nor spoken
    but the text before the call; the response fails with `invalid_tool_call`; the session goes on."""
    client = await _client(server.port)
    get_time = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
    await client.send(type="session.update", session={"type": "realtime", "tools": [get_time],
                                                      "audio": {"input": {"turn_detection": None}}})
    await client.recv_until("session.updated")
    frames = await _ask(client, "Weather?")
    assert not any(f["type"].startswith("response.function_call") for f in frames)
    assert next(f for f in frames if f["type"] == "response.output_audio_transcript.done")["transcript"] == \
        "Let me check. "
    response = frames[-1]["response"]
    assert response["status"] == "failed" and response["status_details"]["error"]["code"] == "invalid_tool_call"
    assert "get_weather" in response["status_details"]["error"]["message"]
    assert [o["type"] for o in response["output"]] == ["message"]
    await client.send(type="session.update", session={"type": "realtime", "tool_choice": "none"})
    await client.recv_until("session.updated")
    assert (await _ask(client, "Again?"))[-1]["response"]["status"] == "completed"
    await client.ws.close()


async def test_a_made_up_call_without_tools_is_never_spoken(server):
    """No tools offered (pipecat's tools may arrive only with its first response.create): the model's call
    is still parsed out — its JSON is neither spoken nor in the transcript — and dropped; the response completes."""
    client = await _client(server.port)
    await client.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    await client.recv_until("session.updated")
    frames = await _ask(client, "Weather?")
    assert not any(f["type"].startswith("response.function_call") for f in frames)
    spoken = "".join(f["delta"] for f in frames if f["type"] == "response.output_audio_transcript.delta")
    assert spoken == "Let me check. " and "get_weather" not in spoken
    response = frames[-1]["response"]
    assert response["status"] == "completed" and [o["type"] for o in response["output"]] == ["message"]
    await client.ws.close()


PARALLEL = ("Let me check both. " + CALL + "\n" + CALL.replace("Paris", "Lyon") + "<|role_end|>" + ANSWER
            + "<|role_end|>")


@pytest.fixture(scope="module")
def parallel_engine():
    eng = _engine(forced_reply=PARALLEL)
    yield eng
    eng.close()


async def test_parallel_calls_round_trip_answers_and_deletes_nothing(parallel_engine):
    """Two calls in one response, both outputs sent back (in the other order), then response.create: the answer
    completes and no item is deleted (issue 43: the prompt has one OBSERVATION turn for both results)."""
    async with RealtimeServer(load_config(None, ["server.port=0"]), parallel_engine) as srv:
        client = await _client(srv.port)
        await client.send(type="session.update", session={"type": "realtime", "tools": [WEATHER],
                                                          "output_modalities": ["text"],
                                                          "audio": {"input": {"turn_detection": None}}})
        await client.recv_until("session.updated")
        frames = await _ask(client, "Weather in Paris and Lyon?")
        calls = [o for o in frames[-1]["response"]["output"] if o["type"] == "function_call"]
        assert [json.loads(c["arguments"])["city"] for c in calls] == ["Paris", "Lyon"]
        for call, sky in zip(reversed(calls), ("rain", "sunny")):
            await client.send(type="conversation.item.create", item={
                "type": "function_call_output", "call_id": call["call_id"], "output": json.dumps({"sky": sky})})
            await client.recv_until("conversation.item.done")
        await client.send(type="response.create")
        frames = await client.recv_until("response.done", timeout=120)
        assert frames[-1]["response"]["status"] == "completed", frames[-1]["response"]
        assert frames[-1]["response"]["output"][0]["content"][0]["text"] == ANSWER
        assert not any(f["type"] == "conversation.item.deleted" for f in client.frames)
        await client.ws.close()
