"""The transcription side request reuses the reply's prefilled KV (`TurnRequest.prefix_from`, `KVSlotManager.fork`).

Real engines on CPU, fp32, greedy: the tiny embedded model, and the fixture checkpoint sharded over two gloo ranks
(every rank copies its K/V shard). The ASR prompt in the shared layout (`session/transcription.asr_followup`) is
the reply's prompt through the user's audio, then the instruction. Submitted together with the reply, the side
request waits for the reply's (chunked) prefill, starts from a copy of its K/V and prefills only the instruction
tail; its transcript is token for token what a separate full prefill of the same prompt gives.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
from conftest import fixture_tokenizers

from realtime_ming.engine import Engine
from realtime_ming.engine.api import (
    Content,
    Message,
    SamplingParams,
    TextDelta,
    TurnDone,
    TurnFailed,
    TurnRequest,
    TurnTask,
)
from realtime_ming.engine.config import EngineConfig, PlacementConfig, ThinkerRunnerConfig
from realtime_ming.engine.kv_slots import KVSlotManager
from realtime_ming.model.multimodal import MediaKind
from realtime_ming.protocol.audio_input import InputTranscription
from realtime_ming.session.transcription import asr_followup, asr_instruction

pytestmark = pytest.mark.timeout(300)

SETTING = InputTranscription(model="whisper-1", language="en", prompt="Ming, realtime, TTFA")


def _run(engine: Engine, *requests: TurnRequest) -> dict[str, tuple[str, TurnDone]]:
    """Submit `requests` back to back; -> turn id -> (streamed text, TurnDone)."""
    texts = {r.turn_id: [] for r in requests}
    ends: dict[str, object] = {}
    finished = threading.Event()

    def sink(event) -> None:
        if isinstance(event, TextDelta):
            texts[event.turn_id].append(event.text)
        elif isinstance(event, TurnDone | TurnFailed):
            ends[event.turn_id] = event
            if len(ends) == len(requests):
                finished.set()

    for request in requests:
        engine.submit(request, sink)
    assert finished.wait(240), ends
    for turn_id, end in ends.items():
        assert isinstance(end, TurnDone), end
    return {t: ("".join(texts[t]), ends[t]) for t in texts}


def _turns(seconds: float = 1.5) -> tuple[TurnRequest, TurnRequest]:
    """A reply over a conversation ending with the user's audio, and its transcription in the shared layout."""
    rng = np.random.default_rng(7)
    audio = Content.of_audio((0.1 * rng.standard_normal(int(16000 * seconds))).astype(np.float32), 16000)
    history = (Message("user", (Content.of_text("Hello there, what can you do for me today?"),)),
               Message("assistant", (Content.of_text("I can talk with you and answer your questions."),)),
               Message("user", (audio,)))
    reply = TurnRequest("reply", "conv", history, system="You are a concise voice assistant.",
                        sampling=SamplingParams(max_tokens=6), with_audio=False)
    asr = TurnRequest("asr", "conv_asr", asr_followup(history, audio, SETTING), system=reply.system,
                      sampling=SamplingParams(max_tokens=12), with_audio=False, task=TurnTask.TRANSCRIBE,
                      prefix_from="conv")
    return reply, asr


def _shared_prefix(engine: Engine, reply: TurnRequest, asr: TurnRequest) -> tuple[int, object]:
    """The tokens of `asr`'s prompt a fork of the fully prefilled reply may keep, and `asr`'s prompt."""
    inputs = engine._thinker.inputs
    held, prompt = inputs.prepare(reply).prompt, inputs.prepare(asr).prompt
    return KVSlotManager.match_prefix(list(held.input_ids), list(prompt.input_ids), prompt.spans), prompt


def _check_fork(engine: Engine) -> None:
    reply, asr = _turns()
    shared, prompt = _shared_prefix(engine, reply, asr)
    (audio_span,) = [s for s in prompt.spans if s.kind is MediaKind.AUDIO]
    assert audio_span.start + audio_span.length <= shared  # the whole audio block is reused
    tail = prompt.input_ids[shared:]
    assert engine.bundle.tokenizer.decode(tail).startswith(asr_instruction(SETTING)[:20])
    # language and prompt are context of the ASR prompt, rendered in the tail after the audio
    assert "Context: Ming, realtime, TTFA" in engine.bundle.tokenizer.decode(tail)
    assert "English" in engine.bundle.tokenizer.decode(tail)

    together = _run(engine, reply, asr)  # submitted with the reply: waits for its prefill, then forks
    engine.close_conversation("conv_asr")
    alone = dataclasses.replace(asr, turn_id="alone", conversation_id="alone", prefix_from=None)
    separate = _run(engine, alone)["alone"]  # the old path: its own slot, the whole prompt prefilled
    engine.close_conversation("alone")

    text, done = together["asr"]
    assert done.prompt_tokens == separate[1].prompt_tokens == len(prompt.input_ids)
    assert done.cached_tokens == shared and separate[1].cached_tokens == 0
    # only the instruction tail is prefilled: the instruction, `<|role_end|>` and the generation prompt
    tok = engine.bundle.tokenizer
    assert done.prompt_tokens - done.cached_tokens == len(tail)
    assert len(tail) <= len(tok.encode(asr_instruction(SETTING))) + len(tok.encode("ASSISTANT")) + 4
    assert done.cached.audio == audio_span.length and done.cached.audio == done.prompt.audio
    assert done.output_tokens == separate[1].output_tokens > 0
    assert text == separate[0]  # greedy, fp32: the same transcript as the separate prefill
    assert together["reply"][1].cached_tokens == 0  # the reply itself was not held up nor changed
    stats = engine.stats()
    assert stats.thinker_rows == 0 and stats.turns == 0 and stats.preparing == 0


def test_transcription_forks_the_replys_prefill_and_equals_a_separate_prefill():
    """Tiny model; a small prefill chunk so the reply's prompt takes several steps and the fork must wait."""
    engine = Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(prefill_chunk_tokens=32)))
    try:
        _check_fork(engine)
    finally:
        engine.close()


def test_side_request_without_its_source_is_a_plain_prefill():
    """No slot of `prefix_from` (closed, never used): the side request prefills everything itself, same text."""
    engine = Engine.create(EngineConfig())
    try:
        reply, asr = _turns(0.8)
        first = _run(engine, asr)["asr"]
        engine.close_conversation("conv_asr")
        again = _run(engine, dataclasses.replace(asr, turn_id="again", prefix_from=None))["again"]
        assert first[1].cached_tokens == 0 and first[0] == again[0]
    finally:
        engine.close()


def test_tp2_forks_copy_kv_on_every_rank(fixture_root):
    """The fixture thinker over two gloo ranks: the forked transcription equals the separate prefill."""
    tokenizers = fixture_tokenizers(fixture_root)
    cfg = EngineConfig(model_path=str(fixture_root), tokenizer_path=tokenizers[0], talker_tokenizer_path=tokenizers[1],
                       placement=PlacementConfig(thinker_devices=("cpu", "cpu")),
                       thinker=ThinkerRunnerConfig(prefill_chunk_tokens=32))
    engine = Engine.create(cfg, warmup=False)
    try:
        _check_fork(engine)
    finally:
        engine.close()
