"""LiveKit agents' OpenAI Realtime plugin against the real server on loopback (issue 18).

livekit-agents 1.8.9 with livekit-plugins-openai, unmodified: the plugin's `RealtimeModel` (`base_url` at our
server through `FrameTap`, which validates every server frame against the openai package's unions) and its
`RealtimeSession` used directly, without a LiveKit room or `AgentSession` (those need a LiveKit server):
this is the layer `AgentSession` drives, and the test does what `AgentActivity` does with it — registers a
`@function_tool`, runs the calls of each generation with `llm.utils.execute_function_call`, puts the outputs
into the chat context with `update_chat_ctx` and asks for the follow-up with `generate_reply`. The plugin's
defaults are kept: `semantic_vad` turn detection and input transcription (`gpt-4o-mini-transcribe`, run by
Ming's own ASR). The engine is the embedded tiny model (CPU) whose thinker plays a forced reply holding a Ming
tool call, then an answer, and whose ASR side turn plays a forced transcript.
"""

from __future__ import annotations

import asyncio
import contextlib

import client_support
import numpy as np
import pytest
from client_support import ANSWER, HEARD, WIRE_HZ
from server_support import espeak, seconds, silence

pytest.importorskip("livekit.plugins.openai", reason="livekit-agents[openai] not installed")

pytestmark = [pytest.mark.realtime, pytest.mark.slow, pytest.mark.timeout(240)]

engine, tap = client_support.engine, client_support.tap  # fixtures: the module's engine, a tapped server a test


class _Generations:
    """Every generation of a session drained as `AgentActivity` would: text, audio frames, function calls."""

    def __init__(self, session) -> None:
        self.done: list[dict] = []
        self.tasks: list[asyncio.Task] = []
        self.changed = asyncio.Event()
        session.on("generation_created", lambda ev: self.tasks.append(asyncio.create_task(self._drain(ev))))

    async def _drain(self, ev) -> None:
        got = {"text": "", "audio": [], "calls": [], "user_initiated": ev.user_initiated}

        async def message(msg) -> None:
            async def text() -> None:
                async for delta in msg.text_stream:
                    got["text"] += str(delta)

            async def audio() -> None:
                async for frame in msg.audio_stream:
                    got["audio"].append(frame)

            await asyncio.gather(text(), audio())

        async def messages() -> None:
            await asyncio.gather(*[message(m) async for m in ev.message_stream])

        async def calls() -> None:
            async for call in ev.function_stream:
                got["calls"].append(call)

        await asyncio.gather(messages(), calls())
        self.done.append(got)
        self.changed.set()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def wait(self, count: int, timeout: float) -> None:
        async with asyncio.timeout(seconds(timeout)):
            while len(self.done) < count:
                self.changed.clear()
                await self.changed.wait()


def _weather_tool(ran: list[str]):
    """A `@function_tool` get_weather(city) that records each city it runs for in `ran`."""
    from livekit.agents import llm

    @llm.function_tool
    async def get_weather(city: str) -> str:
        """The weather of a city."""
        ran.append(city)
        return f"sunny in {city}"

    return get_weather


@contextlib.asynccontextmanager
async def _plugin_session(tap, **options):
    """The plugin's `RealtimeSession` on a `RealtimeModel(**options)` aimed at `tap`, with its generations drained:
    yields (session, generations), closes all three, then checks that every server frame validated and the
    session reported no error."""
    from livekit.plugins.openai import realtime

    model = realtime.RealtimeModel(model="ming", api_key="x", base_url=f"http://127.0.0.1:{tap.port}/v1", **options)
    session = model.session()
    errors: list = []
    session.on("error", errors.append)
    generations = _Generations(session)
    try:
        yield session, generations
    finally:
        await session.aclose()
        await model.aclose()
        await generations.close()
    assert not tap.failures, tap.failures
    assert not errors, errors


async def test_livekit_realtime_session_spoken_turn_tool_and_transcript(tap, tmp_path):
    """espeak speech pushed as rtc.AudioFrames at real time: the server's semantic VAD ends the turn, the
    plugin surfaces the user transcript (`input_audio_transcription_completed`, final, Ming's ASR) and puts
    it in its chat context; the generation's function call runs the `@function_tool` with the model's
    arguments; its output goes back and `generate_reply` brings the spoken answer (audio frames at 24 kHz)."""
    from livekit import rtc
    from livekit.agents.llm.utils import execute_function_call

    ran: list[str] = []
    transcripts: list = []
    async with _plugin_session(tap) as (session, generations):
        session.on("input_audio_transcription_completed", transcripts.append)
        await session.update_tools([_weather_tool(ran)])
        speech = np.concatenate([espeak("What is the weather in Paris?", tmp_path), silence(0.3)])
        pcm = np.clip(np.rint(speech * 32768.0), -32768, 32767).astype("<i2")
        step = WIRE_HZ // 50  # 20 ms frames, at real time
        for start in range(0, pcm.size, step):
            piece = pcm[start:start + step]
            session.push_audio(rtc.AudioFrame(piece.tobytes(), WIRE_HZ, 1, piece.size))
            await asyncio.sleep(0.02)
        # silence until the server's turn detection answers (semantic_vad waits longer on unclear ends)
        quiet = np.zeros(step, dtype="<i2").tobytes()
        async with asyncio.timeout(seconds(30)):
            while not session.has_active_generation and not generations.done:
                session.push_audio(rtc.AudioFrame(quiet, WIRE_HZ, 1, step))
                await asyncio.sleep(0.02)
        await generations.wait(1, 120)
        first = generations.done[0]
        assert [c.name for c in first["calls"]] == ["get_weather"]
        result = await execute_function_call(first["calls"][0], session.tools)
        assert ran == ["Paris"] and result.fnc_call_out is not None and not result.fnc_call_out.is_error
        chat_ctx = session.chat_ctx.copy()
        chat_ctx.items.append(result.fnc_call_out)
        await session.update_chat_ctx(chat_ctx)
        created = await asyncio.wait_for(session.generate_reply(), seconds(30))
        assert created.user_initiated
        await generations.wait(2, 120)
        async with asyncio.timeout(seconds(60)):  # the ASR side turn runs beside the reply
            while not any(t.is_final for t in transcripts):
                await asyncio.sleep(0.05)
    assert first["text"] == "Let me check. " and first["audio"]
    second = generations.done[1]
    assert second["text"] == ANSWER and not second["calls"]
    assert second["audio"] and all(f.sample_rate == WIRE_HZ for f in second["audio"])
    assert sum(f.samples_per_channel for f in second["audio"]) > 0
    final = [t for t in transcripts if t.is_final]
    assert [t.transcript for t in final] == [HEARD]
    completed = next(f for f in tap.frames if f["type"] == "conversation.item.input_audio_transcription.completed")
    assert final[0].item_id == completed["item_id"]
    # the plugin's chat context holds the user's turn with its transcript, the call and its output
    user = session.chat_ctx.get_by_id(completed["item_id"])
    assert user is not None and HEARD in user.text_content
    call_done = next(f for f in tap.frames if f["type"] == "response.function_call_arguments.done")
    outputs = [e["item"] for e in tap.sent if e["type"] == "conversation.item.create"
               and e["item"]["type"] == "function_call_output"]
    assert [(o["call_id"], o["output"]) for o in outputs] == [(call_done["call_id"], "sunny in Paris")]
    assert [f["response"]["status"] for f in tap.frames if f["type"] == "response.done"] == ["completed"] * 2
    session_update = next(e for e in tap.sent if e["type"] == "session.update")
    assert session_update["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"


async def test_livekit_text_session_tool_round_trip(tap):
    """Text only (`modalities=["text"]`, no turn detection, no transcription): the user's message goes in with
    `update_chat_ctx` (created at `previous_item_id="root"`), `generate_reply` brings the call, the tool's
    output goes back the same way and the follow-up generation's text is the answer; no audio comes."""
    from livekit.agents.llm.utils import execute_function_call

    ran: list[str] = []
    async with _plugin_session(tap, modalities=["text"], turn_detection=None,
                               input_audio_transcription=None) as (session, generations):
        await session.update_tools([_weather_tool(ran)])
        chat_ctx = session.chat_ctx.copy()
        chat_ctx.add_message(role="user", content="What's the weather in Paris?")
        await session.update_chat_ctx(chat_ctx)
        await asyncio.wait_for(session.generate_reply(), seconds(30))
        await generations.wait(1, 120)
        (call,) = generations.done[0]["calls"]
        result = await execute_function_call(call, session.tools)
        chat_ctx = session.chat_ctx.copy()
        chat_ctx.items.append(result.fnc_call_out)
        await session.update_chat_ctx(chat_ctx)
        await asyncio.wait_for(session.generate_reply(), seconds(30))
        await generations.wait(2, 120)
    assert ran == ["Paris"]
    first, second = generations.done
    assert first["text"] == "Let me check. " and second["text"] == ANSWER
    assert not first["audio"] and not second["audio"] and not second["calls"]
    creates = [e for e in tap.sent if e["type"] == "conversation.item.create"]
    assert creates[0]["previous_item_id"] == "root" and creates[0]["item"]["role"] == "user"
    assert not any(f["type"].startswith("response.output_audio") for f in tap.frames)
    assert [f["response"]["status"] for f in tap.frames if f["type"] == "response.done"] == ["completed"] * 2
