"""The thinker's turn judgement (`TurnTask.JUDGE_TURN`) on the tiny CPU engine.

Its answer is P("Yes") of the softmax over the two answers' next-token logits after the judgement prompt; here it
is held to a reference computed outside the engine (the prompt's ids through the thinker's own forward, a fresh
KV cache, the answers' ids read from the tokenizer). Submitted with the reply it judges, it forks the reply's
prefilled K/V, changes none of the reply's events, and an engine with the judgement off refuses it clearly.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch

from realtime_ming.engine import Engine
from realtime_ming.engine.api import (
    AudioChunk,
    Content,
    FailureCode,
    Message,
    SamplingParams,
    TextDelta,
    TurnDone,
    TurnFailed,
    TurnJudgement,
    TurnRequest,
    TurnTask,
    engine_supports,
)
from realtime_ming.engine.config import EngineConfig, ThinkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.turn_judgement import (
    ANSWER_COMPLETE,
    ANSWER_INCOMPLETE,
    TURN_QUESTION,
    judgement_history,
    turn_judgement_on,
)
from realtime_ming.model.thinker import ThinkerKVCache

pytestmark = pytest.mark.timeout(120)

SYSTEM = "You are a concise voice assistant."


@pytest.fixture(scope="module")
def judging():
    """The tiny engine with the judgement on; small prefill chunks, so the reply prefills over several steps and
    the judgement's fork has to wait for it."""
    engine = Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(turn_judgement="on", prefill_chunk_tokens=32)))
    yield engine
    engine.close()


def _run(engine: Engine, *requests: TurnRequest) -> dict[str, list]:
    """Submit `requests` back to back; -> turn id -> its events (up to its terminal one)."""
    events: dict[str, list] = {r.turn_id: [] for r in requests}
    ended: set[str] = set()
    finished = threading.Event()

    def sink(event) -> None:
        events[event.turn_id].append(event)
        if isinstance(event, TurnDone | TurnFailed):
            ended.add(event.turn_id)
            if len(ended) == len(requests):
                finished.set()

    for request in requests:
        engine.submit(request, sink)
    assert finished.wait(60), events
    return events


def _pair(history: tuple[Message, ...], tag: str) -> tuple[TurnRequest, TurnRequest]:
    reply = TurnRequest(f"reply-{tag}", f"conv-{tag}", history, system=SYSTEM,
                        sampling=SamplingParams(max_tokens=6), with_audio=False)
    judge = TurnRequest(f"judge-{tag}", f"conv-{tag}_eot", judgement_history(history), system=SYSTEM,
                        sampling=SamplingParams(max_tokens=1), with_audio=False, task=TurnTask.JUDGE_TURN,
                        prefix_from=reply.conversation_id)
    return reply, judge


def _judgement(events: list) -> float:
    (answer,) = [e for e in events if isinstance(e, TurnJudgement)]
    assert isinstance(events[-1], TurnDone) and events.index(answer) < len(events) - 1
    assert not any(isinstance(e, TextDelta | AudioChunk) for e in events)  # never spoken, nothing sampled
    return answer.p_complete


def _text(events: list) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def _reference(engine: Engine, judge: TurnRequest) -> float:
    """P(complete) of `judge`'s prompt outside the engine: its ids through the thinker's forward on a fresh cache,
    softmax over the answers' first-token logits (text-only prompt: 3D positions are the plain positions)."""
    ids = list(engine._thinker.inputs.prepare(judge).prompt.input_ids)
    tok, thinker = engine.bundle.tokenizer, engine.bundle.thinker
    assert tok.decode(ids).rstrip().endswith("ASSISTANT") and TURN_QUESTION in tok.decode(ids)
    t = len(ids)
    cache = ThinkerKVCache.allocate(thinker.cfg, 1, t, tp=thinker.tp)
    pos = torch.arange(t)[None]
    with torch.no_grad():
        hidden = thinker(thinker.embed(torch.tensor([ids])), pos.expand(3, 1, t), cache=cache,
                         slots=torch.tensor([0]), cache_positions=pos)
        logits = thinker.logits(hidden[:, -1])[0]
    yes, no = tok.encode(ANSWER_COMPLETE)[0], tok.encode(ANSWER_INCOMPLETE)[0]
    return float(torch.softmax(logits[[yes, no]].double(), dim=-1)[0])


def test_judgement_equals_an_independent_forward_and_leaves_the_reply_alone(judging):
    history = (Message("user", (Content.of_text("Hello, what can you do?"),)),
               Message("assistant", (Content.of_text("I can answer your questions."),)),
               Message("user", (Content.of_text("I'd like to book a table for"),)))
    reply, judge = _pair(history, "text")
    together = _run(judging, reply, judge)
    p = _judgement(together[judge.turn_id])
    assert 0.0 < p < 1.0
    assert p == pytest.approx(_reference(judging, judge), abs=1e-4)
    done = together[judge.turn_id][-1]
    assert done.cached_tokens > 0 and done.output_tokens == 0  # forked the reply's prefill, sampled nothing
    tok = judging.bundle.tokenizer  # only the question, `<|role_end|>` and the generation prompt are prefilled
    assert done.prompt_tokens - done.cached_tokens <= len(tok.encode(TURN_QUESTION)) + len(tok.encode("ASSISTANT")) + 4
    # the reply: the same text and usage as without the judgement beside it
    alone = _run(judging, dataclasses.replace(reply, turn_id="reply-alone", conversation_id="conv-alone"))
    assert _text(together[reply.turn_id]) == _text(alone["reply-alone"])
    a, b = together[reply.turn_id][-1], alone["reply-alone"][-1]
    assert (a.prompt_tokens, a.cached_tokens, a.output_tokens) == (b.prompt_tokens, b.cached_tokens, b.output_tokens)
    for conversation in ("conv-text", "conv-text_eot", "conv-alone"):
        judging.close_conversation(conversation)


def test_judgement_of_spoken_turn_forks_the_audio_and_equals_a_full_prefill(judging):
    """The user's audio is in the reply's K/V: the fork reuses it, the answer is the full prefill's."""
    rng = np.random.default_rng(3)
    audio = Content.of_audio((0.1 * rng.standard_normal(16000)).astype(np.float32), 16000)
    reply, judge = _pair((Message("user", (audio,)),), "audio")
    together = _run(judging, reply, judge)
    forked = together[judge.turn_id][-1]
    separate = _run(judging, dataclasses.replace(judge, turn_id="judge-alone", conversation_id="alone",
                                                 prefix_from=None))["judge-alone"]
    assert forked.cached.audio == forked.prompt.audio > 0 and separate[-1].cached_tokens == 0
    assert _judgement(together[judge.turn_id]) == pytest.approx(_judgement(separate), abs=1e-4)
    for conversation in ("conv-audio", "conv-audio_eot", "alone"):
        judging.close_conversation(conversation)
    assert judging.info()["turn_judgement"] is True and engine_supports(judging, TurnTask.JUDGE_TURN)


def test_forced_judgement_answers_the_forced_value():
    engine = Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(turn_judgement="on")),
                           hooks=EngineHooks(forced_turn_judgement=0.125))
    try:
        reply, judge = _pair((Message("user", (Content.of_text("What time is it?"),)),), "forced")
        assert _judgement(_run(engine, reply, judge)[judge.turn_id]) == 0.125
    finally:
        engine.close()


def test_judgement_off_is_refused_clearly(engine):
    """The default tiny engine: "auto" is off for random weights; a JUDGE_TURN fails at once, the engine goes on."""
    assert not engine_supports(engine, TurnTask.JUDGE_TURN) and engine.info()["turn_judgement"] is False
    reply, judge = _pair((Message("user", (Content.of_text("What time is it?"),)),), "off")
    events = _run(engine, judge, reply)
    (failed,) = events[judge.turn_id]
    assert isinstance(failed, TurnFailed) and failed.code is FailureCode.TASK_UNAVAILABLE
    assert "turn_judgement" in failed.message
    assert isinstance(events[reply.turn_id][-1], TurnDone)


def test_auto_is_on_for_checkpoint_weights_only():
    assert not turn_judgement_on(EngineConfig())  # the embedded tiny model
    assert not turn_judgement_on(EngineConfig(weights="dummy", preset="tiny"))
    assert turn_judgement_on(EngineConfig(model_path="/models/ming"))
    assert not turn_judgement_on(EngineConfig(model_path="/models/ming", weights="dummy"))
    assert not turn_judgement_on(EngineConfig(model_path="/models/ming",
                                              thinker=ThinkerRunnerConfig(turn_judgement=False)))
    assert turn_judgement_on(EngineConfig(thinker=ThinkerRunnerConfig(turn_judgement="on")))
    with pytest.raises(ValueError, match="turn_judgement"):
        ThinkerRunnerConfig(turn_judgement="sometimes")
    with pytest.raises(ValueError, match="forced_turn_judgement"):
        EngineHooks(forced_turn_judgement=1.5)


def test_scheduler_queues_judgements_behind_replies_and_before_transcriptions():
    from realtime_ming.engine.kv_slots import KVSlotManager
    from realtime_ming.engine.scheduler import Row, Scheduler

    def row(turn_id: str, task: TurnTask) -> Row:
        request = TurnRequest(turn_id, turn_id, (Message("user", (Content.of_text("hi"),)),), task=task)
        return Row(request, KVSlotManager(1, lambda *a: None).slots[0], None, list(range(8)), 0, 0, 8, 0, None, None)

    sched = Scheduler(max_batch=4, prefill_chunk_tokens=64)
    sched.add(row("asr", TurnTask.TRANSCRIBE))
    sched.add(row("judge", TurnTask.JUDGE_TURN))
    sched.add(row("reply", TurnTask.REPLY))
    sched.add(row("judge2", TurnTask.JUDGE_TURN))
    assert list(sched.prefill_queue) == ["reply", "judge", "judge2", "asr"]
