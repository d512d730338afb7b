"""The SDK's tool follow-up response against the real server (tiny model, CPU, forced reply), when another
response holds the conversation at the moment the tool results are ready: the follow-up is asked for once
that response is done, never refused into oblivion, never twice.

The forced reply has three segments, picked by the number of assistant messages in a turn's history: the
first response calls `get_weather`, a response that does not see the result says FILLER, the follow-up
(two assistant messages before it) says ANSWER.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import tiny_engine_fixture
from server_support import seconds

from realtime_ming.protocol import client_events as ce
from realtime_ming.protocol.items import FunctionCallOutputItem
from realtime_ming.protocol.server_events import (
    ConversationItemAdded,
    Error,
    ResponseCreated,
    ResponseDone,
)
from realtime_ming.sdk import RealtimeClient
from realtime_ming.sdk.tools import FOLLOW_UP_KEY

pytestmark = pytest.mark.timeout(240)

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FILLER = "One moment please."
ANSWER = "It is sunny in Paris."
FORCED = CALL + "<|role_end|>" + FILLER + "<|role_end|>" + ANSWER + "<|role_end|>"


engine = tiny_engine_fixture(max_seq_len=2048, forced_reply=FORCED)


def _text(done: ResponseDone) -> str:
    return "".join(getattr(p, "text", None) or getattr(p, "transcript", None) or ""
                   for item in done.response.output for p in getattr(item, "content", ()))


async def _run_until(agent, responses: int, settle_s: float = 2.0) -> list:
    """Events until `responses` response.done have been read, then whatever else arrives in `settle_s`."""
    events: list = []
    done = 0
    async with asyncio.timeout(seconds(180)):
        while done < responses:
            event = await agent.recv()
            events.append(event)
            done += isinstance(event, ResponseDone)
    try:
        async with asyncio.timeout(settle_s):
            while True:
                events.append(await agent.recv())
    except TimeoutError:
        pass
    return events


def _sent_creates(sent: list) -> list[ce.ResponseCreate]:
    return [e for e in sent if isinstance(e, ce.ResponseCreate)]


async def _open(server, sent: list):
    agent = await RealtimeClient.connect(f"ws://127.0.0.1:{server.port}/v1/realtime", model="ming")
    transmit = agent._transmit

    async def recording(event):
        sent.append(event)
        await transmit(event)

    agent._transmit = recording
    return agent


async def get_weather(city: str) -> dict:
    return {"city": city, "sky": "sunny"}


async def _ask_while_racing(agent, racing, responses: int, settle_s: float = 2.0) -> list:
    """Ask the weather (text answers, the `get_weather` tool) with `racing` sending the agent's events from the
    first response.create on; events until `responses` response.done (`_run_until`); the agent is closed."""
    try:
        await agent.add_tool(get_weather)
        await agent.update_session(turn_detection=None, output_modalities="text")
        await agent.add_text("What's the weather in Paris?")
        agent._transmit = racing
        await agent.create_response()
        return await _run_until(agent, responses, settle_s)
    finally:
        await agent.close()


async def test_follow_up_waits_for_the_response_active_when_the_results_are_ready(server):
    """The application starts a (spoken, long) response while the handler runs: the results go in while
    it is active; the SDK asks for the follow-up only after its response.done, and that one answers."""
    sent: list = []
    release = asyncio.Event()

    async def get_weather(city: str) -> dict:
        await release.wait()
        return {"city": city, "sky": "sunny"}

    agent = await _open(server, sent)
    try:
        await agent.add_tool(get_weather)
        await agent.update_session(turn_detection=None, output_modalities="text")
        await agent.add_text("What's the weather in Paris?")
        await agent.create_response()
        async with asyncio.timeout(seconds(120)):
            while not isinstance(event := await agent.recv(), ResponseDone):
                pass
        await agent.create_response(output_modalities="audio")  # holds the conversation for a while
        async with asyncio.timeout(seconds(60)):
            while not isinstance(event := await agent.recv(), ResponseCreated):
                pass
        blocking = event.response.id
        release.set()  # the results are sent while `blocking` is active
        events = await _run_until(agent, 2)
    finally:
        await agent.close()
    assert not [e for e in events if isinstance(e, Error)]
    dones = [e for e in events if isinstance(e, ResponseDone)]
    assert [d.response.id for d in dones][0] == blocking and _text(dones[0]) == FILLER
    output_added = next(i for i, e in enumerate(events) if isinstance(e, ConversationItemAdded)
                        and isinstance(e.item, FunctionCallOutputItem))
    assert output_added < events.index(dones[0])  # the race happened: the results went in during `blocking`
    follow_up = dones[1].response
    assert follow_up.status.value == "completed" and _text(dones[1]) == ANSWER
    assert (follow_up.metadata or {}).get(FOLLOW_UP_KEY)
    assert len(_sent_creates(sent)) == 3  # the application's two and the SDK's one follow-up


async def test_follow_up_refused_by_a_response_that_started_first_is_asked_again(server):
    """A response starts on the server just before the results arrive (as server VAD would), so the SDK's
    response.create is refused with conversation_already_has_active_response: the refusal stays inside
    the SDK, which asks again once that response is done; the follow-up answers."""
    sent: list = []
    agent = await _open(server, sent)
    transmit = agent._transmit
    injected: list = []

    async def racing(event):
        if isinstance(event, ce.ConversationItemCreate) and isinstance(event.item, FunctionCallOutputItem) \
                and not injected:
            injected.append(ce.ResponseCreate(event_id="event_vad_like"))
            await transmit(injected[0])  # the server starts it before it sees the results
        await transmit(event)

    events = await _ask_while_racing(agent, racing, 3)
    assert not [e for e in events if isinstance(e, Error)]  # the refusal was the SDK's own business
    dones = [e for e in events if isinstance(e, ResponseDone)]
    assert len(dones) == 3 and _text(dones[1]) == FILLER  # the racing response did not see the results
    follow_up = dones[2].response
    assert follow_up.status.value == "completed" and _text(dones[2]) == ANSWER
    assert (follow_up.metadata or {}).get(FOLLOW_UP_KEY)
    sdk_creates = [e for e in _sent_creates(sent) if e.response.metadata]
    assert len(sdk_creates) == 2  # refused once, asked again once: never two at a time
    assert sdk_creates[0].event_id != sdk_creates[1].event_id


async def test_a_response_that_sees_the_results_is_the_follow_up(server):
    """A response that starts right after the results (before the SDK's own request) sees them: it is the
    follow-up; the SDK's request is refused, swallowed and not repeated, so there is exactly one answer."""
    sent: list = []
    agent = await _open(server, sent)
    transmit = agent._transmit

    async def racing(event):
        await transmit(event)
        if isinstance(event, ce.ConversationItemCreate) and isinstance(event.item, FunctionCallOutputItem):
            await transmit(ce.ResponseCreate(event_id="event_vad_like"))  # after the results, before the SDK's

    events = await _ask_while_racing(agent, racing, 2, settle_s=3.0)
    assert not [e for e in events if isinstance(e, Error)]
    dones = [e for e in events if isinstance(e, ResponseDone)]
    assert len(dones) == 2 and dones[1].response.status.value == "completed"
    assert not (dones[1].response.metadata or {}).get(FOLLOW_UP_KEY)  # the racing response answered
    assert len([e for e in _sent_creates(sent) if e.response.metadata]) == 1
