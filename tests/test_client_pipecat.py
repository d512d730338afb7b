"""pipecat-ai's OpenAI Realtime LLM service against the real server on loopback (issue 18).

pipecat 1.14's `OpenAIRealtimeLLMService`, unmodified, with `base_url` at our server (through `FrameTap`,
which validates every server frame against the openai package's unions), in a real pipecat pipeline
(`LLMContextAggregatorPair`, a `PipelineWorker` run by a `WorkerRunner`; no transport: frames are queued into
the pipeline and observed by two small processors). The engine is the embedded tiny model (CPU) whose thinker
plays a forced reply holding a Ming tool call, then an answer; its ASR side turn plays a forced transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import client_support
import numpy as np
import pytest
from client_support import ANSWER, HEARD, WIRE_HZ
from frame_tap import FrameTap
from server_support import espeak, seconds, silence

pipecat = pytest.importorskip("pipecat", reason="pipecat-ai[openai] not installed")
pytest.importorskip("pipecat.services.openai.realtime.llm", reason="pipecat-ai[openai] not installed")

pytestmark = [pytest.mark.realtime, pytest.mark.slow, pytest.mark.timeout(240)]

engine, tap = client_support.engine, client_support.tap  # fixtures: the module's engine, a tapped server a test


class _Recorder:
    """Frames seen at one point of the pipeline, both directions, with a wake-up per frame."""

    def __init__(self) -> None:
        self.frames: list = []
        self.changed = asyncio.Event()

    def processor(self):
        from pipecat.processors.frame_processor import FrameProcessor

        recorder = self

        class Tap(FrameProcessor):
            async def process_frame(self, frame, direction):
                await super().process_frame(frame, direction)
                recorder.frames.append(frame)
                recorder.changed.set()
                await self.push_frame(frame, direction)

        return Tap()

    def of(self, kind) -> list:
        return [f for f in self.frames if isinstance(f, kind)]

    async def wait(self, predicate, timeout: float) -> None:
        async with asyncio.timeout(seconds(timeout)):
            while not predicate():  # also polled: the predicate may read the tap's frames
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 0.1)


def _weather_tool(calls: list, hold=None):
    """The tool and its handler; `hold` (optional): awaited before the handler returns its result."""
    from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema

    async def get_weather(params) -> None:
        calls.append(dict(params.arguments))
        if hold is not None:
            await hold()
        await params.result_callback({"city": params.arguments["city"], "sky": "sunny"})

    schema = FunctionSchema(name="get_weather", description="The weather of a city.",
                            properties={"city": {"type": "string"}}, required=["city"])
    return ToolsSchema(standard_tools=[schema]), get_weather


async def _run(tap: FrameTap, session_properties, messages: list, calls: list, script, *, tools_in_session=False,
               hold=None):
    """Build the pipeline, run `script(worker, before, after, context)` while it runs, then end it. The tool
    is offered in the context (sent with it on the first response) or, `tools_in_session`, in the session
    properties (sent on connect: what a bot that waits for the user's voice needs). `hold(context)`, if given,
    is awaited by the tool's handler before it returns its result."""
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import (
        LLMContextAggregatorPair,
    )
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
    from pipecat.workers.runner import WorkerRunner

    # `context` (assigned below) is read when the handler runs
    tools, handler = _weather_tool(calls, None if hold is None else lambda: hold(context))
    if tools_in_session:
        session_properties.tools = tools
    llm = OpenAIRealtimeLLMService(api_key="x", base_url=tap.url, settings=OpenAIRealtimeLLMService.Settings(
        model="ming", session_properties=session_properties))
    llm.register_function("get_weather", handler)
    context = LLMContext(messages=messages) if tools_in_session else LLMContext(messages=messages, tools=tools)
    pair = LLMContextAggregatorPair(context)
    before, after = _Recorder(), _Recorder()
    pipeline = Pipeline([pair.user(), before.processor(), llm, after.processor(), pair.assistant()])
    worker = PipelineWorker(pipeline, idle_timeout_secs=None, enable_rtvi=False, check_dangling_tasks=False)
    runner = WorkerRunner(handle_sigint=False, check_dangling_tasks=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    try:
        await script(worker, before, after, context)
    finally:
        await worker.cancel()
        await asyncio.wait_for(run, seconds(20))
    return before, after


async def test_pipecat_text_turn_runs_the_tool_and_speaks_the_answer(tap):
    """Manual turns (`turn_detection=False`, as pipecat sends it): the context's user message goes in,
    the model's call runs the registered handler with its arguments, the result goes back and pipecat
    asks for the follow-up response, which is spoken (TTS audio frames) and says the answer."""
    from pipecat.frames.frames import (
        ErrorFrame,
        FunctionCallResultFrame,
        LLMFullResponseEndFrame,
        LLMRunFrame,
        TTSAudioRawFrame,
        TTSTextFrame,
    )
    from pipecat.services.openai.realtime import events

    calls: list = []
    props = events.SessionProperties(audio=events.AudioConfiguration(input=events.AudioInput(turn_detection=False)))

    async def script(worker, before, after, context):
        await worker.queue_frames([LLMRunFrame()])
        await after.wait(lambda: len(after.of(LLMFullResponseEndFrame)) >= 2 and calls, 150)

    before, after = await _run(tap, props, [{"role": "user", "content": "What's the weather in Paris?"}], calls, script)
    assert not tap.failures, tap.failures
    assert not after.of(ErrorFrame) and not before.of(ErrorFrame), after.of(ErrorFrame) + before.of(ErrorFrame)
    assert calls == [{"city": "Paris"}]
    (result,) = after.of(FunctionCallResultFrame)
    assert result.function_name == "get_weather" and result.result == {"city": "Paris", "sky": "sunny"}
    spoken = "".join(f.text for f in after.of(TTSTextFrame))
    assert spoken == "Let me check. " + ANSWER
    audio = after.of(TTSAudioRawFrame)
    assert audio and all(f.sample_rate == WIRE_HZ for f in audio) and sum(len(f.audio) for f in audio) > 0
    # what went over the wire: the call's output answers the call id the server gave
    outputs = [e["item"] for e in tap.sent if e["type"] == "conversation.item.create"
               and e["item"]["type"] == "function_call_output"]
    call_done = next(f for f in tap.frames if f["type"] == "response.function_call_arguments.done")
    assert [o["call_id"] for o in outputs] == [call_done["call_id"]]
    assert json.loads(outputs[0]["output"]) == {"city": "Paris", "sky": "sunny"}
    done = [f["response"] for f in tap.frames if f["type"] == "response.done"]
    assert [d["status"] for d in done] == ["completed", "completed"]


async def _user_message_in(context) -> None:
    """Until pipecat's context holds the user's transcribed message (pipecat writes it there on its own clock)."""
    async with asyncio.timeout(seconds(60)):
        while not any(m.get("role") == "user" for m in context.get_messages() if isinstance(m, dict)):
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("transcript_first", [False, True], ids=["as-it-comes", "transcript-first"])
async def test_pipecat_spoken_turn_gets_a_transcription_frame_and_a_spoken_reply(tap, tmp_path, transcript_first):
    """Server VAD (pipecat's default, no `turn_detection`) and input transcription requested pipecat's
    way (`InputAudioTranscription()`): espeak speech streamed as InputAudioRawFrames at real time ends a
    turn; the server transcribes it with Ming's ASR and pipecat surfaces a TranscriptionFrame; the reply
    (a tool call, then after the handler's result the answer) comes back as audio.

    Pipecat's follow-up after the result is the first response it creates itself: it first sends its whole
    local context packed into one user message ("a previously saved conversation"). Whether the user's
    transcript is in that context yet is a race on pipecat's side (its handoff timer against the transcript,
    which the server sends once the reply streams): `transcript-first` holds the handler's result until it is,
    the order a busy host gives (a larger message: see `client_support.forced_tool_engine`)."""
    from pipecat.frames.frames import (
        ErrorFrame,
        InputAudioRawFrame,
        LLMFullResponseEndFrame,
        TranscriptionFrame,
        TTSAudioRawFrame,
    )
    from pipecat.services.openai.realtime import events

    calls: list = []
    props = events.SessionProperties(audio=events.AudioConfiguration(
        input=events.AudioInput(transcription=events.InputAudioTranscription())))
    speech = np.concatenate([espeak("What is the weather in Paris?", tmp_path), silence(1.2)])
    pcm = np.clip(np.rint(speech * 32768.0), -32768, 32767).astype("<i2").tobytes()

    async def script(worker, before, after, context):
        await before.wait(lambda: tap.types().count("session.updated") >= 1, 30)
        step = WIRE_HZ // 50 * 2  # 20 ms
        for start in range(0, len(pcm), step):
            await worker.queue_frame(InputAudioRawFrame(audio=pcm[start:start + step], sample_rate=WIRE_HZ,
                                                        num_channels=1))
            await asyncio.sleep(0.02)
        await after.wait(lambda: len(after.of(LLMFullResponseEndFrame)) >= 2 and before.of(TranscriptionFrame),
                         150)

    before, after = await _run(tap, props, [], calls, script, tools_in_session=True,
                               hold=_user_message_in if transcript_first else None)
    assert not tap.failures, tap.failures
    assert not after.of(ErrorFrame) and not before.of(ErrorFrame), after.of(ErrorFrame) + before.of(ErrorFrame)
    (transcript,) = before.of(TranscriptionFrame)
    completed = next(f for f in tap.frames if f["type"] == "conversation.item.input_audio_transcription.completed")
    assert transcript.text == completed["transcript"] == HEARD
    assert calls == [{"city": "Paris"}]
    assert sum(len(f.audio) for f in after.of(TTSAudioRawFrame)) > 0
    # the handler's output answered the server's call id, and the follow-up response completed
    call_done = next(f for f in tap.frames if f["type"] == "response.function_call_arguments.done")
    outputs = [e["item"] for e in tap.sent if e["type"] == "conversation.item.create"
               and e["item"]["type"] == "function_call_output"]
    assert [o["call_id"] for o in outputs] == [call_done["call_id"]]
    done = [f["response"] for f in tap.frames if f["type"] == "response.done"]
    # the call, then the answer; pipecat may ask twice (once the transcript reaches its context, and after the
    # result, held until the other is done): the later one may be cut by the pipeline's end, never fail
    statuses = [d["status"] for d in done]
    assert statuses[:2] == ["completed", "completed"] and set(statuses[2:]) <= {"completed", "cancelled"}, done
    assert tap.types().index("response.function_call_arguments.done") < tap.types().index("response.done")
    # pipecat's packed context went in as one user message (with the user's question once the transcript was first)
    (packed,) = [e["item"]["content"][0]["text"] for e in tap.sent if e["type"] == "conversation.item.create"
                 and e["item"].get("role") == "user"]
    assert "get_weather" in packed and (HEARD in packed or not transcript_first)
