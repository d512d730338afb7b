"""Admission's encoders run off the engine thread (engine/encoder_worker.py): while one turn's audio is being
encoded, the turns already running keep decoding; the encoded turn's output equals the same turn run alone;
a cancel or an encoder failure while encoding ends that turn alone and frees its slot."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import fixture_tokenizers
from realtime_ming.engine import Engine
from realtime_ming.engine.api import (
    Content,
    FailureCode,
    Message,
    SamplingParams,
    Stage,
    TextDelta,
    TurnCancelled,
    TurnDone,
    TurnFailed,
    TurnRequest,
)
from realtime_ming.engine.config import EngineConfig, ThinkerRunnerConfig
from realtime_ming.engine.encoder_worker import _CPU_ENCODER_NICENESS, EncoderWorker
from realtime_ming.engine.models import ModelBundle

pytestmark = pytest.mark.timeout(120)

_TERMINAL = (TurnDone, TurnCancelled, TurnFailed)


def _config(fixture_root) -> EngineConfig:
    return EngineConfig(model_path=str(fixture_root), tokenizer_path=fixture_tokenizers(fixture_root)[0],
                        talker_tokenizer_path=fixture_tokenizers(fixture_root)[1],
                        thinker=ThinkerRunnerConfig(max_slots=8, max_seq_len=512, prefill_chunk_tokens=64))


@pytest.fixture(scope="module")
def bundle(fixture_root) -> ModelBundle:
    return ModelBundle.load(_config(fixture_root))


class _Turn:
    def __init__(self):
        self.events, self.done = [], threading.Event()

    def __call__(self, ev):
        self.events.append(ev)
        if isinstance(ev, _TERMINAL):
            self.done.set()

    @property
    def end(self):
        return self.events[-1]

    def deltas(self) -> int:
        return sum(isinstance(e, TextDelta) for e in self.events)


def _text_turn(turn_id: str, max_tokens: int) -> TurnRequest:
    return TurnRequest(turn_id, turn_id, (Message("user", (Content.of_text("Tell me about the sea."),)),),
                       sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True), with_audio=False)


def _audio_turn(turn_id: str) -> TurnRequest:
    audio = (0.1 * np.random.default_rng(7).standard_normal(16000)).astype(np.float32)
    content = (Content.of_audio(audio, 16000), Content.of_text("What did I say?"))
    return TurnRequest(turn_id, turn_id, (Message("user", content),), sampling=SamplingParams(max_tokens=6),
                       with_audio=False)


@pytest.fixture
def gated(bundle, monkeypatch):
    """The bundle's audio encoder, held at its start until `release` is set (or failing, if `fail` is set)."""
    real = bundle.encode_audio
    started, release, fail = threading.Event(), threading.Event(), []
    threads = []

    def encode(wave, graphed=True):
        threads.append(threading.current_thread().name)
        started.set()
        assert release.wait(60)
        if fail:
            raise fail[0] if isinstance(fail[0], Exception) else ValueError(fail[0])
        return real(wave, graphed)

    monkeypatch.setattr(bundle, "encode_audio", encode)
    yield started, release, fail, threads
    release.set()


def test_running_turns_decode_while_another_turn_is_encoded(fixture_root, bundle, gated):
    started, release, _, threads = gated
    release.set()  # the reference run: the audio turn alone
    engine = Engine(_config(fixture_root), bundle)
    try:
        alone = _Turn()
        engine.submit(_audio_turn("alone"), alone)
        assert alone.done.wait(60) and isinstance(alone.end, TurnDone), alone.events
        release.clear()
        started.clear()

        running = _Turn()
        engine.submit(_text_turn("running", 24), running)
        while running.deltas() < 2:  # it is decoding
            assert not running.done.wait(0.01)
        spoken = _Turn()
        engine.submit(_audio_turn("spoken"), spoken)
        assert started.wait(30)
        at_start = running.deltas()
        # the audio turn's encoder is held: the running turn decodes to its end meanwhile
        assert running.done.wait(60) and isinstance(running.end, TurnDone), running.events
        assert running.end.output_tokens == 24 and running.deltas() > at_start
        assert not spoken.done.is_set()
        assert not any(isinstance(e, TextDelta) for e in spoken.events)
        release.set()
        assert spoken.done.wait(60) and isinstance(spoken.end, TurnDone), spoken.events
    finally:
        engine.close()
    assert set(threads) == {"realtime-ming-encoders"}  # never on the engine thread
    # the same numbers as the turn run alone (same greedy text, tokens, cached prefix)
    assert (spoken.end.text, spoken.end.output_tokens, spoken.end.prompt_tokens) == \
        (alone.end.text, alone.end.output_tokens, alone.end.prompt_tokens)
    assert Stage.ENCODERS_DONE in spoken.end.stages
    assert spoken.end.stages[Stage.ENCODERS_DONE] > running.end.stages[Stage.DONE]


def test_cancel_while_encoding_frees_the_slot(fixture_root, bundle, gated):
    started, release, _, _ = gated
    engine = Engine(_config(fixture_root), bundle)
    try:
        turn = _Turn()
        engine.submit(_audio_turn("c"), turn)
        assert started.wait(30)
        engine.cancel("c")
        assert turn.done.wait(30) and isinstance(turn.end, TurnCancelled)
        release.set()
        stats = engine.stats()
        assert (stats.turns, stats.thinker_rows) == (0, 0)
        after = _Turn()  # the conversation's slot is free for its next turn
        engine.submit(_text_turn("c", 3), after)
        assert after.done.wait(60) and isinstance(after.end, TurnDone)
    finally:
        engine.close()


def test_encoder_failure_fails_that_turn_alone(fixture_root, bundle, gated):
    started, release, fail, _ = gated
    fail.append("audio the encoder rejects")
    engine = Engine(_config(fixture_root), bundle)
    try:
        running, bad = _Turn(), _Turn()
        engine.submit(_text_turn("ok", 12), running)
        engine.submit(_audio_turn("bad"), bad)
        assert started.wait(30)
        release.set()
        assert bad.done.wait(30) and isinstance(bad.end, TurnFailed)
        assert bad.end.code is FailureCode.INVALID_PROMPT and "encoder rejects" in str(bad.end.message)
        assert running.done.wait(60) and isinstance(running.end, TurnDone)
        assert engine.health().alive and engine.stats().thinker_rows == 0
    finally:
        engine.close()


@pytest.mark.parametrize("where", ["encoder", "splice"])
def test_unexpected_encoder_or_splice_fault_fails_that_turn_alone(fixture_root, bundle, gated, monkeypatch, where):
    """A bug reached on the encoder worker, or in the splice that completes the admission on the engine thread:
    engine_admission_failed for that turn alone (its cache dropped), a running turn completes, the engine lives,
    and the same conversation's next turn is admitted and completes."""
    started, release, fail, _ = gated
    engine = Engine(_config(fixture_root), bundle)
    try:
        if where == "encoder":
            fail.append(TypeError("encoder bug"))
        else:
            queue_prefill = engine._thinker._queue

            def splice(pending, embeds):
                if pending.request.turn_id == "bad":
                    raise TypeError("splice bug")
                return queue_prefill(pending, embeds)

            monkeypatch.setattr(engine._thinker, "_queue", splice)
        running, bad = _Turn(), _Turn()
        engine.submit(_text_turn("ok", 12), running)
        engine.submit(_audio_turn("bad"), bad)
        assert started.wait(30)
        release.set()
        assert bad.done.wait(30) and isinstance(bad.end, TurnFailed), bad.events
        assert bad.end.code is FailureCode.ADMISSION_FAILED and f"{where} bug" in str(bad.end.message)
        assert running.done.wait(60) and isinstance(running.end, TurnDone)
        assert engine.health().alive
        fail.clear()
        again = _Turn()
        engine.submit(dataclasses.replace(_audio_turn("bad-again"), conversation_id="bad"), again)
        assert again.done.wait(60) and isinstance(again.end, TurnDone), again.events
        assert engine.stats().thinker_rows == 0
    finally:
        engine.close()


def test_without_the_worker_encoders_run_on_the_engine_thread_with_the_same_output(fixture_root, bundle):
    """`engine.encoder_worker: false`: no worker thread; an audio turn is encoded on the engine thread and says
    exactly what it says with the worker."""
    texts, threads = {}, {}
    real = bundle.encode_audio
    for worker in (True, False):
        seen = []

        def encode(wave, graphed=True, seen=seen):
            seen.append(threading.current_thread().name)
            return real(wave, graphed)

        bundle.encode_audio = encode
        try:
            engine = Engine(dataclasses.replace(_config(fixture_root), encoder_worker=worker), bundle)
            try:
                assert (engine._thinker._encoder is not None) is worker
                turn = _Turn()
                engine.submit(_audio_turn(f"a-{worker}"), turn)
                assert turn.done.wait(90) and isinstance(turn.end, TurnDone)
                texts[worker] = turn.end.text
            finally:
                engine.close()
        finally:
            bundle.encode_audio = real
        threads[worker] = set(seen)
    assert texts[True] == texts[False]
    assert threads[False] and all("encoder" not in name.lower() for name in threads[False])
    assert threads[True] and threads[True] != threads[False]


def test_the_engine_thread_idles_while_the_only_admission_is_encoded(fixture_root, bundle, gated, monkeypatch):
    """Nothing to step but an admission on the encoder worker: the engine thread blocks on its inbox (the worker
    wakes it) instead of launching empty steps in a loop, which would hold the GIL the encoders need."""
    started, release, _, _ = gated
    engine = Engine(_config(fixture_root), bundle)
    launches = []
    real_launch = engine._thinker.launch
    monkeypatch.setattr(engine._thinker, "launch", lambda: launches.append(1) or real_launch())
    try:
        spoken = _Turn()
        engine.submit(_audio_turn("spoken"), spoken)
        assert started.wait(30)
        before = len(launches)
        threading.Event().wait(0.5)  # the encoder is held: nothing for the engine to do
        idle_launches = len(launches) - before
        release.set()
        assert spoken.done.wait(60) and isinstance(spoken.end, TurnDone), spoken.events
    finally:
        engine.close()
    assert idle_launches <= 3, f"{idle_launches} empty thinker launches in 0.5 s while an admission was encoded"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_cpu_encoders_run_nicer_than_the_engine_thread():
    """Issue 43, finding 9: on a CPU host the worker (and the intra-op threads it starts) runs at a lower CPU
    priority than the threads that step the engine, so a big image's vision encoder takes what they leave."""
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    worker = EncoderWorker(SimpleNamespace(devices={"encoder": "cpu"}), vision=lambda *a: None,
                           out_device=torch.device("cpu"))
    try:
        ran = threading.Event()
        worker.submit((), (), 0).add_done_callback(lambda _f: ran.set())  # an empty tail, on the worker thread
        assert ran.wait(30)
        assert os.getpriority(os.PRIO_PROCESS, worker._thread.native_id) == min(base + _CPU_ENCODER_NICENESS, 19)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # the caller keeps its own
    finally:
        worker.close()
