"""The SDK's handler API and transcripts against the real server (tiny model, CPU): a tool handler that raises
sends its error as the call's output and the agent still answers; a GA transcription session driven by the SDK
transcribes a spoken espeak-ng turn into `agent.transcripts` and never responds."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from server_support import espeak, seconds, silence
from tools_support import ANSWER, forced_engine, server  # noqa: F401 - fixtures: the forced-reply engine and its server

from realtime_ming.protocol.audio_input import InputTranscription, ServerVad
from realtime_ming.protocol.items import FunctionCallItem
from realtime_ming.protocol.server_events import (
    ConversationItemInputAudioTranscriptionCompleted,
    Error,
    InputAudioBufferCommitted,
    ResponseDone,
    SessionUpdated,
)
from realtime_ming.protocol.session import SessionType
from realtime_ming.sdk import RealtimeClient

pytestmark = pytest.mark.timeout(240)


async def test_a_failing_handler_sends_its_error_as_the_output_and_the_agent_answers(server):  # noqa: F811
    calls: list[str] = []

    def get_weather(city: str) -> str:  # a plain function: run in a worker thread
        """The weather of a city."""
        calls.append(city)
        raise ValueError(f"no weather station in {city}")

    async with RealtimeClient.connect(f"ws://127.0.0.1:{server.port}/v1/realtime", model="ming") as agent:
        await agent.add_tool(get_weather)
        await agent.update_session(turn_detection=None, output_modalities="text")
        await agent.add_text("What's the weather in Paris?")
        await agent.create_response()
        done: list[ResponseDone] = []
        errors: list[Error] = []
        async with asyncio.timeout(seconds(180)):
            async for event in agent:
                errors += [event] if isinstance(event, Error) else []
                if isinstance(event, ResponseDone):
                    done.append(event)
                    if len(done) == 2:
                        break
        assert not agent.is_closed
    assert calls == ["Paris"] and not errors
    first, second = (d.response for d in done)
    call = first.output[-1]
    assert isinstance(call, FunctionCallItem)
    (result,) = agent.tool_runner.results
    assert result.call_id == call.call_id
    assert json.loads(result.output) == {"error": "ValueError: no weather station in Paris"}
    assert second.status.value == "completed" and second.output[0].content[0].text == ANSWER


async def test_sdk_transcription_session_transcribes_a_spoken_turn_and_never_responds(engine, tmp_path):
    from realtime_ming.server import RealtimeServer, load_config

    speech = espeak("Turn on the kitchen lights.", tmp_path)
    async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as srv:
        async with RealtimeClient.connect(f"ws://127.0.0.1:{srv.port}/v1/realtime", model="ming") as agent:
            await agent.update_session(session_type="transcription",
                                       transcription=InputTranscription(model="whisper-1", language="en"),
                                       turn_detection=ServerVad(silence_duration_ms=400))
            async with asyncio.timeout(seconds(30)):
                async for event in agent:
                    if isinstance(event, SessionUpdated):
                        break
            assert agent.session.session_type is SessionType.TRANSCRIPTION
            await agent.send_audio(np.concatenate([speech, silence(1.0)]), sample_rate_hz=24000, realtime=True)
            seen: list = []
            async with asyncio.timeout(seconds(120)):
                async for event in agent:
                    seen.append(event)
                    if isinstance(event, ConversationItemInputAudioTranscriptionCompleted):
                        break
            (committed,) = [e for e in seen if isinstance(e, InputAudioBufferCommitted)]
            completed = seen[-1]
            assert completed.item_id == committed.item_id
            entry = agent.transcripts[committed.item_id]
            assert entry.done and entry.error is None and entry.text == completed.transcript
            assert await agent.transcripts.wait(committed.item_id) == completed.transcript
            await agent.create_response()
            async with asyncio.timeout(seconds(30)):
                async for event in agent:
                    seen.append(event)
                    if isinstance(event, Error):
                        break
            assert event.error.code == "transcription_session_no_response"
            assert not any(type(e).__name__.startswith("Response") for e in seen)
