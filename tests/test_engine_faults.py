"""Engine supervision on a real engine (embedded tiny model, CPU): faults injected into the thinker runner.

An exception of any `Exception` class in admission fails that turn alone (ADMISSION_FAILED), one in a step
fails the turns in flight (ENGINE_ERROR); either way other turns complete and the next turn works. A
BaseException kills the engine thread: every in-flight and every later turn ends ENGINE_UNAVAILABLE at once,
`health()` says why, and nothing hangs. A tensor-parallel worker that exits does the same (gloo, CPU).
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from conftest import fixture_tokenizers, fresh_engine_fixture
from server_support import seconds

from realtime_ming.engine import Engine
from realtime_ming.engine.api import (
    Content,
    FailureCode,
    Message,
    SamplingParams,
    TextDelta,
    TurnCancelled,
    TurnDone,
    TurnFailed,
    TurnRequest,
)
from realtime_ming.engine.config import EngineConfig

pytestmark = pytest.mark.timeout(180)

_TERMINAL = (TurnDone, TurnCancelled, TurnFailed)


class CustomFault(Exception):
    """An exception class the engine has never heard of."""


class ThreadKiller(BaseException):
    """Not an Exception: nothing in the engine's per-command handling may swallow it."""


class Recorder:
    def __init__(self) -> None:
        self.events: list = []
        self.finished = threading.Event()
        self.first_text = threading.Event()

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, TextDelta):
            self.first_text.set()
        if isinstance(event, _TERMINAL):
            self.finished.set()

    def wait(self, timeout: float = 60.0):
        assert self.finished.wait(timeout), self.events[-3:]
        terminal = [e for e in self.events if isinstance(e, _TERMINAL)]
        assert len(terminal) == 1 and self.events[-1] is terminal[0], self.events[-3:]  # exactly one, last
        return terminal[0]


def _request(turn_id: str, text: str = "Hello there", *, conversation: str | None = None,
             max_tokens: int = 8) -> TurnRequest:
    return TurnRequest(turn_id, conversation or turn_id, (Message("user", (Content.of_text(text),)),),
                       sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True), with_audio=False)


def _submit(engine: Engine, request: TurnRequest) -> Recorder:
    rec = Recorder()
    engine.submit(request, rec)
    return rec


engine = fresh_engine_fixture()


def _raise_for(method, marker: str, exc: BaseException):
    """`method`, except that a request whose turn id starts with `marker` raises `exc`."""

    def patched(request, *args, **kwargs):
        if request.turn_id.startswith(marker):
            raise exc
        return method(request, *args, **kwargs)

    return patched


def _raise_once(method, exc: BaseException, armed: threading.Event):
    """`method`, except that the first call after `armed` is set raises `exc`."""

    def patched(*args, **kwargs):
        if armed.is_set():
            armed.clear()
            raise exc
        return method(*args, **kwargs)

    return patched


@pytest.mark.parametrize("exc", [TypeError("lone surrogate"), KeyError("missing"), CustomFault("odd")],
                         ids=lambda e: type(e).__name__)
def test_admission_fault_fails_only_that_turn(engine, monkeypatch, exc):
    """A fault while admitting one turn: ADMISSION_FAILED for it, a turn in progress completes, the engine lives
    and the next turn of the same conversation completes."""
    monkeypatch.setattr(engine._thinker, "admit", _raise_for(engine._thinker.admit, "bad", exc))
    running = _submit(engine, _request("running", max_tokens=40))
    assert running.first_text.wait(30)
    failed = _submit(engine, _request("bad-1", conversation="c")).wait()
    assert isinstance(failed, TurnFailed) and failed.code is FailureCode.ADMISSION_FAILED
    assert type(exc).__name__ in failed.message
    done = running.wait()
    assert isinstance(done, TurnDone) and done.output_tokens == 40
    assert engine.health().alive
    assert isinstance(_submit(engine, _request("good-1", conversation="c")).wait(), TurnDone)
    stats = engine.stats()
    assert (stats.turns, stats.thinker_rows) == (0, 0)


@pytest.mark.parametrize("exc", [TypeError("bad shape"), KeyError("row"), CustomFault("kernel")],
                         ids=lambda e: type(e).__name__)
def test_step_fault_fails_the_turns_in_flight_and_the_engine_goes_on(engine, monkeypatch, exc):
    """A fault in a thinker step: the turns in that step end ENGINE_ERROR; the next turns (same conversations,
    whose cached prefix is dropped) complete."""
    armed = threading.Event()
    monkeypatch.setattr(engine._thinker, "launch", _raise_once(engine._thinker.launch, exc, armed))
    a = _submit(engine, _request("a", conversation="ca", max_tokens=200))
    b = _submit(engine, _request("b", conversation="cb", max_tokens=200))
    assert a.first_text.wait(30) and b.first_text.wait(30)
    armed.set()
    for rec in (a, b):
        failed = rec.wait()
        assert isinstance(failed, TurnFailed) and failed.code is FailureCode.ENGINE_ERROR, failed
    assert engine.health().alive
    for name in ("a2", "b2"):
        done = _submit(engine, _request(name, conversation="c" + name[0])).wait()
        assert isinstance(done, TurnDone) and done.cached_tokens == 0
    stats = engine.stats()
    assert (stats.turns, stats.thinker_rows) == (0, 0)


def test_command_fault_is_reported_and_cancel_still_ends_the_turn(engine, monkeypatch):
    """A fault applying a non-submit command: close_conversation fails quietly, a cancel whose cleanup raises
    still ends its turn (TurnCancelled); the engine serves on."""
    monkeypatch.setattr(engine._thinker, "close_conversation", lambda _cid: (_ for _ in ()).throw(KeyError("slot")))
    engine.close_conversation("nope")
    real_cancel = engine._thinker.cancel
    monkeypatch.setattr(engine._thinker, "cancel", lambda turn_id: (real_cancel(turn_id), 1 / 0))
    rec = _submit(engine, _request("long", max_tokens=400))
    assert rec.first_text.wait(30)
    engine.cancel("long")
    assert isinstance(rec.wait(), TurnCancelled)
    assert engine.health().alive
    monkeypatch.undo()
    assert isinstance(_submit(engine, _request("after")).wait(), TurnDone)


def _assert_dead_and_fast(engine: Engine, reason_part: str) -> None:
    """Dead: health says why, a new turn fails with ENGINE_UNAVAILABLE, stats answer "unknown" instead of waiting for
    the dead thread, and close returns."""
    deadline = time.monotonic() + seconds(30)  # a bound on a hang, not a claim about speed
    while engine.health().alive and time.monotonic() < deadline:
        time.sleep(0.01)
    health = engine.health()
    assert not health.alive and reason_part in health.reason, health
    later = _submit(engine, _request("later"))
    failed = later.wait(seconds(30))
    assert isinstance(failed, TurnFailed) and failed.code is FailureCode.ENGINE_UNAVAILABLE
    assert engine.stats().turns == -1  # answered at once ("unknown"), not after the 10 s wait
    engine.close()


@pytest.mark.parametrize("where", ["admission", "step"])
def test_base_exception_kills_the_engine_visibly(engine, monkeypatch, where):
    """A BaseException on the engine thread: every in-flight turn ends ENGINE_UNAVAILABLE promptly, health() is
    dead with the reason, and every later turn fails at once instead of hanging."""
    running = _submit(engine, _request("running", max_tokens=400))
    assert running.first_text.wait(30)
    if where == "admission":
        monkeypatch.setattr(engine._thinker, "admit", _raise_for(engine._thinker.admit, "killer", ThreadKiller()))
        killer = _submit(engine, _request("killer"))
    else:
        armed = threading.Event()
        monkeypatch.setattr(engine._thinker, "launch", _raise_once(engine._thinker.launch, ThreadKiller(), armed))
        armed.set()
        killer = None
    for rec in (running, killer) if killer else (running,):
        failed = rec.wait(5.0)
        assert isinstance(failed, TurnFailed) and failed.code is FailureCode.ENGINE_UNAVAILABLE, failed
    _assert_dead_and_fast(engine, "ThreadKiller")


def test_fault_injection_is_off_by_default_and_kills_when_enabled(tiny_bundle, monkeypatch):
    """The documented kill marker does nothing unless REALTIME_MING_FAULT_INJECTION=1 is set at engine start."""
    from realtime_ming.engine.supervision import FAULT_INJECTION_ENV, KILL_ENGINE_MARKER

    monkeypatch.delenv(FAULT_INJECTION_ENV, raising=False)
    engine = Engine(EngineConfig(), tiny_bundle)
    try:
        assert isinstance(_submit(engine, _request("t", f"say {KILL_ENGINE_MARKER}")).wait(), TurnDone)
        assert engine.health().alive
    finally:
        engine.close()
    monkeypatch.setenv(FAULT_INJECTION_ENV, "1")
    engine = Engine(EngineConfig(), tiny_bundle)
    failed = _submit(engine, _request("t", f"say {KILL_ENGINE_MARKER}")).wait(5.0)
    assert isinstance(failed, TurnFailed) and failed.code is FailureCode.ENGINE_UNAVAILABLE
    _assert_dead_and_fast(engine, "fault injection")


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_tp_worker_death_is_detected_by_its_watcher(fixture_root):
    """TP=2 over gloo: killing the rank-1 worker process makes the engine dead (its process sentinel is watched,
    nothing polls on the engine thread), fails the turn in flight with ENGINE_UNAVAILABLE, and close() returns."""
    from realtime_ming.engine.config import PlacementConfig

    thinker_tok, talker_tok = fixture_tokenizers(fixture_root)  # on the set's own special ids
    cfg = EngineConfig(model_path=str(fixture_root), tokenizer_path=thinker_tok, talker_tokenizer_path=talker_tok,
                       placement=PlacementConfig(thinker_devices=("cpu", "cpu")))
    engine = Engine.create(cfg, warmup=False)
    try:
        assert isinstance(_submit(engine, _request("warm", max_tokens=4)).wait(120), TurnDone)
        running = _submit(engine, _request("running", max_tokens=100_000 // 200))
        assert running.first_text.wait(60)
        worker = engine.bundle.thinker.procs[0]
        os.kill(worker.pid, 9)
        failed = running.wait(seconds(60))  # the turn would otherwise run for 500 tokens, then end TurnDone
        assert isinstance(failed, TurnFailed) and failed.code is FailureCode.ENGINE_UNAVAILABLE
        health = engine.health()
        assert not health.alive and "tp-rank-1" in health.reason and "-9" in health.reason, health
        assert isinstance(_submit(engine, _request("later")).wait(seconds(30)), TurnFailed)
    finally:
        engine.close()
