"""SessionRunner hands the appends queued behind each other to the session-audio pool in one call.

A session that fell behind (a loaded server) catches up in one thread hop instead of one per 20 ms
frame; what the client sees is exactly what the Sans-I/O session produces for the same inputs one by
one, a batch never crosses another client event, and an exception stops the batch where it happened.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from server_support import EnergyVad, StubEngine, pcm16_b64, silence, tone
from session_support import MODEL_HZ, PCM16K, Harness

from realtime_ming.protocol import Dialect, parse, serialise
from realtime_ming.session import Session, SessionSettings
from realtime_ming.session import runner as runner_module
from realtime_ming.session.runner import SessionRunner

FRAME = MODEL_HZ * 20 // 1000  # 20 ms
# server_vad without responses: the turn's events are the session's alone (no engine output to interleave)
SETUP = {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
    "format": PCM16K, "turn_detection": {"type": "server_vad", "create_response": False}}}}}


def _frames() -> list[dict]:
    """A spoken turn and its silence in 20 ms appends, a session.update in the middle, more silence."""
    samples = np.concatenate([tone(0.6, MODEL_HZ), silence(0.9, MODEL_HZ)]).astype(np.float32)
    appends = [{"type": "input_audio_buffer.append", "audio": pcm16_b64(samples[i : i + FRAME])}
               for i in range(0, samples.size, FRAME)]
    middle = {"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}
    return [*appends[:40], middle, *appends[40:]]


def _session() -> Session:
    return Session(SessionSettings(), dialect=Dialect.GA, model="ming-test", voices=("DB30",),
                   default_voice="DB30", make_vad=lambda _backend: EnergyVad())


async def _run_queued(frames: list[dict], runner_hook=None) -> tuple[list[dict], list[int], asyncio.Task]:
    """Queue every frame before the session task starts, then let it run; (frames sent, batch sizes, task)."""
    engine = StubEngine()
    sent: list[dict] = []
    session = _session()

    async def emit(event) -> None:
        text = serialise(event, Dialect.GA)
        if text is not None:
            sent.append(json.loads(text))

    runner = SessionRunner(session, engine, emit=emit, max_pending_client=len(frames) + 2)
    sizes: list[int] = []
    handle = runner._handle_appends

    def counting(batch, now, done):
        sizes.append(len(batch))
        return handle(batch, now, done)

    runner._handle_appends = counting
    if runner_hook is not None:
        runner_hook(runner)
    for frame in [SETUP, *frames]:
        await runner.put_client(parse(json.dumps(frame), Dialect.GA))
    task = asyncio.create_task(runner.run())
    for _ in range(400):
        await asyncio.sleep(0.01)
        if task.done() or (runner._inbox.empty() and runner._held is None and sum(sizes) == len(
                [f for f in frames if f["type"] == "input_audio_buffer.append"]) and runner._worker.done()):
            break
    await asyncio.sleep(0.05)
    return sent, sizes, task


async def test_queued_appends_are_one_worker_call_and_change_nothing_the_client_sees():
    frames = _frames()
    sent, sizes, task = await _run_queued(frames)
    task.cancel()
    reference = Harness()
    reference.send(**SETUP)
    for frame in frames:
        reference.send(**frame)

    def summary(events: list[dict]) -> list[tuple]:
        return [(e["type"], e.get("audio_start_ms"), e.get("audio_end_ms")) for e in events]

    assert summary(sent) == summary(reference.frames)
    assert any(e["type"] == "input_audio_buffer.speech_stopped" for e in sent)  # the turn did end
    num_appends = len(frames) - 1
    assert sum(sizes) == num_appends
    assert max(sizes) <= runner_module._MAX_APPEND_BATCH
    assert len(sizes) < num_appends  # batched, not one hop per frame
    # no batch crosses the session.update between append 40 and 41
    totals = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    assert 40 in totals


async def test_an_exception_stops_the_batch_where_it_happened():
    frames = _frames()[:10]
    calls: list[int] = []

    def hook(runner: SessionRunner) -> None:
        handle = runner.session.handle_client_event

        def failing(event, now):
            if event.type == "input_audio_buffer.append":
                calls.append(1)
                if len(calls) == 3:
                    raise RuntimeError("boom")
            return handle(event, now)

        runner.session.handle_client_event = failing

    with pytest.raises(RuntimeError, match="boom"):
        _, _, task = await _run_queued(frames, hook)
        await task
    assert len(calls) == 3  # the appends after the failing one were not handled
