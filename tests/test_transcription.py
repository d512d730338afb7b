"""Input audio transcription by Ming's own ASR (`session/transcription.py`).

Session level (scripted engine events, every frame validated against the openai unions): the side turn's
request, its events, the stored transcript, `.failed`, model checks. End to end (real engine on the
embedded tiny model, in-process server on loopback, espeak-ng speech at real time): a spoken turn with
transcription on yields `.delta`s and `.completed` for its item, retrieve returns the transcript, and the
transcript is what the engine itself produces for the recorded ASR request when run again offline.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from server_support import RecordingEngine, WsClient, chunks, espeak, pcm16_b64, silence, tone
from session_support import MODEL_HZ, PCM16K, Harness, engine_pcm
from websockets.asyncio.client import connect

from realtime_ming.engine.api import (
    AudioChunk,
    ContentKind,
    FailureCode,
    FinishReason,
    TextDelta,
    TurnDone,
    TurnFailed,
    TurnTask,
)
from realtime_ming.protocol import Dialect
from realtime_ming.session import CancelTurn, CloseConversation
from realtime_ming.session.transcription import (
    ASR_INSTRUCTION,
    OPENAI_TRANSCRIPTION_MODELS,
)

pytestmark = pytest.mark.timeout(240)

GA_ASR = {"type": "realtime", "audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}}}


def _asr_requests(h: Harness) -> list:
    return [r for r in h.submitted() if r.task is TurnTask.TRANSCRIBE]


# ---- session level ---------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_committed_audio_gets_a_transcription_side_turn_and_its_events(dialect):
    """Commit → one text-only TRANSCRIBE turn with the reference ASR prompt; deltas, completed (usage from the
    engine's counts), the transcript stored on the item; no response is created by it."""
    h = Harness(dialect)
    if dialect is Dialect.GA:
        h.send(type="session.update", session=GA_ASR)
    else:
        h.send(type="session.update", session={"input_audio_transcription": {"model": "whisper-1"}})
    echoed = h.last("session.updated")["session"]
    setting = echoed["audio"]["input"]["transcription"] if dialect is Dialect.GA else echoed["input_audio_transcription"]
    assert setting["model"] == "ming-test"  # what runs is reported
    h.manual_audio_turn(0.5)
    item_id = h.last("input_audio_buffer.committed")["item_id"]
    (request,) = _asr_requests(h)
    assert not request.with_audio and request.sampling.temperature == 0.0
    assert request.conversation_id != h.session.conversation_id  # its own KV slot
    (message,) = request.history
    assert message.role == "user" and message.content[0].text == ASR_INSTRUCTION
    assert message.content[1].kind is ContentKind.AUDIO  # the committed audio itself, at the model's 16 kHz
    assert message.content[1] is h.session.conversation.get(item_id).content[0]

    mark = len(h.frames)
    h.engine(TextDelta(request.turn_id, "what time"))
    h.engine(TextDelta(request.turn_id, " is it"))
    h.engine(TurnDone(request.turn_id, "what time is it", FinishReason.STOP, 40, 0, 4, 0, {}))
    prefix = "conversation.item.input_audio_transcription"
    assert h.types(mark) == [f"{prefix}.delta", f"{prefix}.delta", f"{prefix}.completed"]
    done = h.last(f"{prefix}.completed")
    assert (done["item_id"], done["content_index"], done["transcript"]) == (item_id, 0, "what time is it")
    assert done["usage"] == {"type": "tokens", "input_tokens": 40, "output_tokens": 4, "total_tokens": 44}
    assert CloseConversation(request.conversation_id) in h.commands  # its KV slot is freed at once
    assert "".join(f["delta"] for f in h.frames[mark:] if f["type"] == f"{prefix}.delta") == done["transcript"]
    h.send(type="conversation.item.retrieve", item_id=item_id)
    part = h.last("conversation.item.retrieved")["item"]["content"][0]
    assert part["transcript"] == "what time is it" and part["audio"]
    assert "response.created" not in h.types()


@pytest.mark.parametrize("first_output", ["audio", "failure"])
def test_vad_turn_transcription_waits_for_the_replys_first_audio(first_output):
    """A server-VAD turn that starts a reply: its transcription is held until that reply's first audio, so it
    never competes with the reply's first tokens; then it is submitted (a failed reply drops the item and it)."""
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {
        "format": PCM16K, "transcription": {"model": "gpt-4o-mini-transcribe"}}}})
    h.append(silence(0.5, MODEL_HZ))
    h.append(tone(0.6, MODEL_HZ))
    h.append(silence(1.0, MODEL_HZ))
    (reply,) = h.submitted()
    assert h.last("response.created") and _asr_requests(h) == []
    item_id = h.last("input_audio_buffer.committed")["item_id"]
    if first_output == "audio":
        h.engine(TextDelta(reply.turn_id, "Hi"))
        assert _asr_requests(h) == []  # text alone is not the first audio of a spoken reply
        h.engine(AudioChunk(reply.turn_id, engine_pcm(0.2)))
        assert _asr_requests(h) == []  # not while the first audio delta is being sent
        h.engine(AudioChunk(reply.turn_id, engine_pcm(0.2)))
        (asr,) = _asr_requests(h)
        # the shared layout: the reply's own prompt, the instruction following the user's audio in its turn, and
        # the reply's conversation as the slot it forks
        assert asr.history[:-1] == reply.history[:-1] and asr.prefix_from == reply.conversation_id
        assert (asr.system, asr.tools, asr.truncation) == (reply.system, reply.tools, reply.truncation)
        audio, instruction = asr.history[-1].content
        assert audio is reply.history[-1].content[0] and instruction.text == ASR_INSTRUCTION
        assert np.array_equal(audio.audio, h.session.conversation.get(item_id).content[0].audio)
    else:  # the failed reply removes its input item: nothing is left to transcribe
        h.engine(TurnFailed(reply.turn_id, "boom", FailureCode.ENGINE_ERROR))
        assert h.last("conversation.item.deleted")["item_id"] == item_id
        assert _asr_requests(h) == []
        h.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "hi"}]})
        assert _asr_requests(h) == []  # and nothing stays held
        assert not h.session._transcriber.has_pending


def test_language_and_prompt_are_context_of_the_asr_prompt():
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"transcription": {
        "model": "ming-test", "language": "en", "prompt": "Ming, realtime, TTFA"}}}})
    h.manual_audio_turn(0.3)
    text = _asr_requests(h)[0].history[0].content[0].text
    assert text.startswith("Context: Ming, realtime, TTFA\n")
    assert "English" in text and "recognize the language" not in text
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"transcription": {
        "languages": ["en", "zh"], "keywords": ["Ming", "TTFA"], "delay": None}}}})
    echoed = h.last("session.updated")["session"]["audio"]["input"]["transcription"]
    assert echoed["keywords"] == ["Ming", "TTFA"] and echoed["languages"] == ["en", "zh"]
    h.append(tone(0.3, MODEL_HZ))
    h.send(type="input_audio_buffer.commit")
    text = _asr_requests(h)[1].history[0].content[0].text
    assert text.startswith("Hotwords: Ming, TTFA\n") and "English or Chinese" in text


def test_transcription_delay_is_refused_not_ignored():
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"transcription": {"delay": "low"}}}})
    error = h.last("error")["error"]
    assert error["code"] == "invalid_value" and error["param"] == "session.audio.input.transcription.delay"
    assert h.session.config.transcription is None


def test_failed_transcription_gives_failed_event_and_keeps_the_session():
    h = Harness()
    h.send(type="session.update", session=GA_ASR)
    h.manual_audio_turn(0.3)
    (request,) = _asr_requests(h)
    item_id = h.last("input_audio_buffer.committed")["item_id"]
    h.engine(TurnFailed(request.turn_id, "every thinker KV slot is in use", FailureCode.ENGINE_BUSY))
    failed = h.last("conversation.item.input_audio_transcription.failed")
    assert failed["item_id"] == item_id and failed["content_index"] == 0
    assert failed["error"]["code"] == "transcription_failed" and "capacity" in failed["error"]["message"]
    h.send(type="conversation.item.retrieve", item_id=item_id)  # the item stays, without a transcript
    assert h.last("conversation.item.retrieved")["item"]["content"][0].get("transcript") is None
    h.send(type="response.create")
    assert h.last("response.created")


def test_off_by_default_and_null_turns_it_off():
    h = Harness()
    h.manual_audio_turn(0.3)
    assert _asr_requests(h) == []
    h.send(type="session.update", session=GA_ASR)
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"transcription": None}}})
    h.append(silence(0.3, MODEL_HZ))
    h.send(type="input_audio_buffer.commit")
    assert _asr_requests(h) == []


@pytest.mark.parametrize("model", ["gpt-4o-transcribe-diarize", "my-asr"])
def test_unsupported_transcription_model_is_a_clear_error(model):
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"transcription": {"model": model}}}})
    error = h.last("error")["error"]
    assert error["code"] == "unsupported_transcription_model"
    assert error["param"] == "session.audio.input.transcription.model"
    assert h.session.config.transcription is None  # nothing changed
    for name in OPENAI_TRANSCRIPTION_MODELS:
        h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"transcription": {"model": name}}}})
        assert h.last("session.updated")["session"]["audio"]["input"]["transcription"]["model"] == "ming-test"


def test_deleting_the_item_cancels_its_transcription_and_close_frees_the_slot():
    h = Harness()
    h.send(type="session.update", session=GA_ASR)
    h.manual_audio_turn(0.3)
    (request,) = _asr_requests(h)
    item_id = h.last("input_audio_buffer.committed")["item_id"]
    h.send(type="conversation.item.delete", item_id=item_id)
    assert CancelTurn(request.turn_id) in h.commands
    mark = len(h.frames)
    h.engine(TextDelta(request.turn_id, "late"))  # already in flight: dropped
    assert h.types(mark) == []
    assert CloseConversation(request.conversation_id) in h.session.close()


# ---- end to end ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    return espeak("What time is it now?", tmp_path_factory.mktemp("speech"))


async def _offline_text(engine, request) -> str:
    """Run `request` again on its own (new ids): the engine's own transcript of the same prompt."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    texts: list[str] = []

    def sink(event) -> None:
        def take() -> None:
            if isinstance(event, TextDelta):
                texts.append(event.text)
            elif isinstance(event, TurnDone | TurnFailed) and not done.done():
                done.set_result(event)
        loop.call_soon_threadsafe(take)

    engine.submit(dataclasses.replace(request, turn_id="offline_asr", conversation_id="offline_asr", prefix_from=None),
                  sink)
    assert isinstance(await asyncio.wait_for(done, 120), TurnDone)
    engine.close_conversation("offline_asr")
    return "".join(texts)


async def test_spoken_turn_is_transcribed_by_the_engine_beside_the_reply(engine, speech):
    from realtime_ming.server import RealtimeServer, load_config

    recording = RecordingEngine(engine)
    async with RealtimeServer(load_config(None, ["server.port=0"]), recording) as server:
        ws = await connect(f"ws://127.0.0.1:{server.port}/v1/realtime?model=ming")
        client = WsClient(ws, Dialect.GA)
        created = await client.recv()
        await client.send(type="session.update", session={"type": "realtime", "max_output_tokens": 8, "audio": {
            "input": {"transcription": {"model": "whisper-1", "language": "en"}}}})
        updated = (await client.recv_until("session.updated"))[-1]["session"]
        assert updated["audio"]["input"]["transcription"]["model"] == created["session"]["model"]
        loop = asyncio.get_running_loop()
        start = loop.time()
        audio = np.concatenate([speech, silence(1.2)])
        for i, piece in enumerate(chunks(audio, 20)):
            await client.send(type="input_audio_buffer.append", audio=pcm16_b64(piece))
            await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - loop.time()))
        seen: set[str] = set()
        async with asyncio.timeout(120):
            while not {"response.done", "conversation.item.input_audio_transcription.completed"} <= seen:
                seen.add((await client.recv(30))["type"])
        frames = client.frames
        item_id = next(f["item_id"] for f in frames if f["type"] == "input_audio_buffer.committed")
        deltas = [f for f in frames if f["type"] == "conversation.item.input_audio_transcription.delta"]
        (completed,) = [f for f in frames if f["type"] == "conversation.item.input_audio_transcription.completed"]
        assert deltas and all((f["item_id"], f["content_index"]) == (item_id, 0) for f in deltas)
        assert completed["item_id"] == item_id and completed["transcript"] == "".join(f["delta"] for f in deltas)
        assert completed["usage"]["output_tokens"] >= len(deltas) and completed["usage"]["input_tokens"] > 0
        response = next(f for f in frames if f["type"] == "response.done")["response"]
        assert response["status"] in ("completed", "incomplete")  # the reply ran beside it (8 tokens at most)
        assert any(f["type"] == "response.output_audio.delta" for f in frames)

        await client.send(type="conversation.item.retrieve", item_id=item_id)
        retrieved = (await client.recv_until("conversation.item.retrieved"))[-1]["item"]
        assert retrieved["content"][0]["transcript"] == completed["transcript"]
        await ws.close()

    (asr,) = [r for r in recording.requests if r.task is TurnTask.TRANSCRIBE]
    audio, instruction = asr.history[-1].content  # the shared layout: the reply's prompt, then the instruction
    assert "English" in instruction.text and not asr.with_audio
    (reply,) = [r for r in recording.requests if r.task is TurnTask.REPLY]
    assert asr.prefix_from == reply.conversation_id and asr.history[:-1] == reply.history[:-1]
    # it started from the reply's prefilled K/V: the whole audio was reused, only the instruction prefilled
    usage = recording.done[asr.turn_id]
    tail = usage.prompt_tokens - usage.cached_tokens  # the instruction, `<|role_end|>`, the generation prompt
    assert usage.cached.audio == usage.prompt.audio > 0 and tail <= len(engine.bundle.tokenizer.encode(instruction.text)) + 16
    heard_s = audio.audio.size / MODEL_HZ
    assert abs(heard_s - speech.size / 24000) < 0.8  # the user's speech, not the trailing silence
    # the transcript is the model's own: the same ASR request run again alone gives the same (greedy) text
    assert await _offline_text(engine, asr) == completed["transcript"]


async def test_sdk_surfaces_transcripts_and_failures(engine, speech):
    """LocalAgent (beta dialect, manual commit, no response): `agent.transcripts` has the item's transcript,
    the same as the `.completed` event read from the stream; a failed one raises TranscriptionFailed."""
    from realtime_ming.protocol import (
        ConversationItemInputAudioTranscriptionCompleted,
        InputAudioBufferCommitted,
    )
    from realtime_ming.protocol.audio_input import InputTranscription
    from realtime_ming.protocol.responses import ErrorDetail
    from realtime_ming.protocol.server_events import (
        ConversationItemInputAudioTranscriptionFailed,
    )
    from realtime_ming.sdk import LocalAgent, TranscriptionFailed

    async with LocalAgent.start(engine, beta=True) as agent:
        await agent.update_session(turn_detection=None, transcription=InputTranscription(model="whisper-1"))
        await agent.send_audio(speech, sample_rate_hz=24000)
        await agent.commit()
        committed, completed = None, None
        async with asyncio.timeout(120):
            while completed is None:
                event = await agent.recv()
                if isinstance(event, InputAudioBufferCommitted):
                    committed = event
                elif isinstance(event, ConversationItemInputAudioTranscriptionCompleted):
                    completed = event
        assert committed is not None and completed.item_id == committed.item_id
        assert await agent.transcripts.wait(committed.item_id, timeout_s=1) == completed.transcript
        assert agent.transcripts[committed.item_id].done
        # the failure path as a server would report it
        error = ErrorDetail(type="server_error", code="transcription_failed", message="no")
        agent.transcripts.observe(ConversationItemInputAudioTranscriptionFailed(
            item_id="item_x", content_index=0, error=error))
        with pytest.raises(TranscriptionFailed) as failed:
            await agent.transcripts.wait("item_x", timeout_s=1)
        assert failed.value.error.code == "transcription_failed"


def test_forced_transcript_is_said_once_by_transcription_turns_only():
    """The `forced_transcript` hook replaces only TRANSCRIBE rows' tokens (then the turn stops), and
    `forced_reply` only replies', the two running side by side."""
    import threading

    from realtime_ming.engine import Engine
    from realtime_ming.engine.api import Content, Message, SamplingParams, TurnRequest
    from realtime_ming.engine.config import EngineConfig
    from realtime_ming.engine.hooks import EngineHooks

    said, reply = "what time is it now", "Sure thing."
    eng = Engine.create(EngineConfig(), hooks=EngineHooks(forced_reply=reply, forced_transcript=said))
    try:
        audio = Content.of_audio(np.zeros(16000, np.float32), 16000)
        texts: dict[str, list[str]] = {"asr": [], "reply": []}
        ends: dict[str, object] = {}
        finished = threading.Event()

        def sink_for(name):
            def sink(event):
                if isinstance(event, TextDelta):
                    texts[name].append(event.text)
                elif isinstance(event, TurnDone | TurnFailed):
                    ends[name] = event
                    if len(ends) == 2:
                        finished.set()
            return sink

        asr = TurnRequest("asr", "c_asr", (Message("user", (Content.of_text(ASR_INSTRUCTION), audio)),),
                          sampling=SamplingParams(max_tokens=64), with_audio=False, task=TurnTask.TRANSCRIBE)
        answer = TurnRequest("reply", "c", (Message("user", (audio,)),), sampling=SamplingParams(max_tokens=6),
                             with_audio=False)
        eng.submit(asr, sink_for("asr"))
        eng.submit(answer, sink_for("reply"))
        assert finished.wait(120)
    finally:
        eng.close()
    assert "".join(texts["asr"]).strip() == said and ends["asr"].finish_reason is FinishReason.STOP
    assert ends["asr"].output_tokens < 64
    assert "".join(texts["reply"]).startswith(reply[:4]) and ends["reply"].finish_reason is FinishReason.LENGTH
