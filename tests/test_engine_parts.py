"""The engine's parts on their own (CPU): KV-slot manager (LRU, prefix matching, forks), scheduler priorities and
prefill packing, the input processor's content cache and its work off the engine thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from realtime_ming.engine.api import Content, EngineBusyError, Message, SamplingParams, TurnRequest, TurnTask
from realtime_ming.engine.kv_slots import KVSlotManager, copy_kv_prefix
from realtime_ming.engine.scheduler import Row, Scheduler
from realtime_ming.model.multimodal import MediaKind, MediaSpan
from realtime_ming.model.thinker import ThinkerKVCache


def _cache(slots=3, capacity=16):
    shape = (2, slots, 1, capacity + 1, 4)  # [layers, slots, kv_heads, capacity + 1, head_dim]
    return ThinkerKVCache(torch.zeros(shape), torch.zeros(shape))


def _manager(slots=3):
    cache = _cache(slots)
    return KVSlotManager(slots, lambda src, dst, n: copy_kv_prefix(cache, src, dst, n)), cache


def test_slots_reuse_own_then_free_then_least_recently_used():
    slots, _ = _manager(3)
    a = slots.acquire("a")
    a.ids = [1, 2, 3]
    b = slots.acquire("b")
    c = slots.acquire("c")
    assert len({a.index, b.index, c.index}) == 3 and slots.num_cached() == 3
    assert slots.acquire("a") is a and a.ids == [1, 2, 3]  # its own slot, prefix kept
    d = slots.acquire("d")  # no free slot: the least recently used (b) is emptied for d
    assert d is b and d.ids == [] and d.conversation_id == "d"
    for s in slots.slots:
        s.busy = "turn"
    with pytest.raises(EngineBusyError):
        slots.acquire("e")
    a.busy = None
    slots.close_conversation("a")
    assert a.conversation_id is None and a.ids == [] and slots.num_cached() == 2
    assert slots.peek("c") == ()  # busy: no hint


def test_prefix_match_keeps_a_token_to_prefill_and_never_splits_media():
    held = [1, 2, 3, 4, 5, 6, 7]
    assert KVSlotManager.match_prefix(held, [1, 2, 3, 9], ()) == 3
    assert KVSlotManager.match_prefix(held, held, ()) == len(held) - 1  # one token left for the logits
    image = MediaSpan(MediaKind.IMAGE, 3, 3)  # placeholders at 3..5, start token at 2
    assert KVSlotManager.match_prefix(held, [1, 2, 3, 4, 5, 9, 9], (image,)) == 2
    assert KVSlotManager.match_prefix(held, [1, 2, 3, 4, 5, 6, 7, 8], (image,)) == 7


def test_fork_copies_the_shared_prefix_device_side_and_spares_the_source():
    slots, cache = _manager(3)
    src = slots.acquire("conv")
    src.ids = [5, 6, 7, 8, 9]
    cache.k[:, src.index, :, :5] = torch.arange(1.0, 6.0)[:, None]
    cache.v[:, src.index, :, :5] = -torch.arange(1.0, 6.0)[:, None]
    src.busy = "reply"  # the source may be generating: its prefix stays valid
    other = slots.acquire("other")
    other.ids = [1]
    side, held = slots.fork("conv", "conv/asr", [5, 6, 7, 1, 2])
    assert held == 3 and side.ids == [5, 6, 7] and side is not src
    assert torch.equal(cache.k[:, side.index, :, :3], cache.k[:, src.index, :, :3])
    assert torch.equal(cache.v[:, side.index, :, :3], cache.v[:, src.index, :, :3])
    assert not cache.k[:, side.index, :, 3:].any()  # nothing past the prefix copied
    assert src.ids == [5, 6, 7, 8, 9] and src.conversation_id == "conv"


def test_fork_never_evicts_its_source_and_falls_back_without_one():
    slots, _ = _manager(2)
    src = slots.acquire("conv")
    src.ids = [1, 2, 3]
    slots.acquire("old").ids = [4]  # the least recently used is now `old`... make the source the oldest:
    slots.acquire("old")
    src.last_used = -1
    side, held = slots.fork("conv", "side", [1, 2, 9])
    assert side.conversation_id == "side" and src.conversation_id == "conv" and held == 2
    alone, held = slots.fork("missing", "side2", [1, 2, 9])  # no source slot: a plain acquire
    assert held == 0 and alone.ids == []


def _row(turn_id, task=TurnTask.REPLY, tail=10):
    request = TurnRequest(turn_id, turn_id, (Message("user", (Content.of_text("hi"),)),),
                          sampling=SamplingParams(max_tokens=4), task=task)
    slot = KVSlotManager(1, lambda *a: None).slots[0]
    return Row(request, slot, None, list(range(tail)), 0, 0, tail, 0, None, None)


def test_scheduler_puts_replies_before_waiting_side_requests_and_packs_prefills():
    sched = Scheduler(max_batch=4, prefill_chunk_tokens=24)
    sched.add(_row("r1"))
    sched.add(_row("asr", TurnTask.TRANSCRIBE))
    sched.add(_row("r2"))
    assert list(sched.prefill_queue) == ["r1", "r2", "asr"]  # the reply overtakes the waiting transcription
    chosen = sched.prefill_batch()
    assert [(r.request.turn_id, s, e) for r, s, e in chosen] == [("r1", 0, 10), ("r2", 0, 10)]  # 3 x 10 > 24
    done = sched.prefilled(chosen)
    assert [r.request.turn_id for r in done] == ["r1", "r2"] and list(sched.prefill_queue) == ["asr"]
    sched.add(_row("r3", tail=40))  # behind the transcription, which has not started yet either
    assert list(sched.prefill_queue) == ["r3", "asr"]
    chosen = sched.prefill_batch()
    assert [(r.request.turn_id, s, e) for r, s, e in chosen] == [("r3", 0, 24)]  # a chunk of the budget
    assert sched.prefilled(chosen) == [] and sched.rows["r3"].offset == 24
    row = sched.remove("r3")
    assert row is not None and row.slot.busy is None and list(sched.prefill_queue) == ["asr"]
    assert not sched.is_live(row)


def test_scheduler_shares_the_prefill_round_robin_so_a_long_prompt_delays_a_short_one_by_one_chunk():
    sched = Scheduler(max_batch=4, prefill_chunk_tokens=24)
    sched.add(_row("image", tail=100))  # a large image's prompt: 5 chunks
    chosen = sched.prefill_batch()
    assert [(r.request.turn_id, s, e) for r, s, e in chosen] == [("image", 0, 24)]
    sched.add(_row("short", tail=8))  # another session's turn arrives meanwhile
    sched.add(_row("asr", TurnTask.TRANSCRIBE))
    assert sched.prefilled(chosen) == [] and list(sched.prefill_queue) == ["short", "image", "asr"]
    chosen = sched.prefill_batch()
    assert [(r.request.turn_id, s, e) for r, s, e in chosen] == [("short", 0, 8)]  # 2 rows x 24 > 24
    assert [r.request.turn_id for r in sched.prefilled(chosen)] == ["short"]
    chosen = sched.prefill_batch()
    assert [(r.request.turn_id, s, e) for r, s, e in chosen] == [("image", 24, 48)]  # the image resumes
    sched.prefilled(chosen)
    assert list(sched.prefill_queue) == ["image", "asr"]  # still before the side request not started


def test_prefill_pace_cuts_chunks_to_the_step_budget_from_measured_costs():
    from realtime_ming.engine.prefill_pace import PrefillPace

    pace = PrefillPace(step_ms=250.0, max_tokens=256)
    assert pace.budget() == 256  # nothing measured yet
    pace.observe(256, 0.001)  # a GPU: the host only launches (4 us per token)
    assert pace.budget() == 256
    pace = PrefillPace(step_ms=250.0, max_tokens=256)
    pace.observe(256, 1.28)  # a CPU deep into a long prompt: 5 ms per token
    assert pace.budget() == 50
    pace.observe(50, 0.5)  # costlier still (10 ms): the average moves halfway
    assert pace.budget() == 33
    for _ in range(20):
        pace.observe(16, 16.0)  # a very slow host: never below the smallest chunk
    assert pace.budget() == 16
    assert PrefillPace(step_ms=0.0, max_tokens=256).budget() == 256  # off
    sched = Scheduler(max_batch=4, prefill_chunk_tokens=256)
    sched.add(_row("image", tail=1000))
    assert [(s, e) for _, s, e in sched.prefill_batch(budget=50)] == [(0, 50)]


def test_scheduler_prefill_batch_stops_where_no_graph_serves():
    sched = Scheduler(max_batch=8, prefill_chunk_tokens=64)
    for i in range(4):
        sched.add(_row(f"r{i}", tail=8))
    assert len(sched.prefill_batch()) == 4
    assert len(sched.prefill_batch(lambda width, rows: rows <= 2)) == 2


# ---- input processor ----------------------------------------------------------------------------------------


def _image(seed=0, h=768, w=1024):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_media_cache_is_by_content_and_bounded():
    from realtime_ming.engine.input_processor import MediaCache

    cache = MediaCache(max_bytes=3000)
    calls = []

    def compute(n):
        calls.append(n)
        return np.zeros(n, dtype=np.uint8)

    a, same = _image(1, 64, 64), _image(1, 64, 64)
    assert cache.digest(a) == cache.digest(same) != cache.digest(_image(2, 64, 64))
    assert cache.digest(a) != cache.digest(a.reshape(64, 192))  # the shape is part of the key
    cache.get(("x", cache.digest(a)), lambda: compute(1000))
    cache.get(("x", cache.digest(same)), lambda: compute(1000))  # another array, same content: a hit
    assert calls == [1000] and (cache.hits, cache.misses) == (1, 1)
    cache.get(("y",), lambda: compute(1500))
    cache.get(("z",), lambda: compute(1500))  # over budget: the least recently used (x) goes
    cache.get(("x", cache.digest(a)), lambda: compute(1000))
    assert calls == [1000, 1500, 1500, 1000]
    cache.get(("huge",), lambda: compute(10_000))  # larger than the budget: returned, not kept
    cache.get(("huge",), lambda: compute(10_000))
    assert calls[-2:] == [10_000, 10_000]


@pytest.fixture(scope="module")
def engine():
    from realtime_ming.engine import Engine
    from realtime_ming.engine.config import EngineConfig, ThinkerRunnerConfig
    from realtime_ming.engine.hooks import EngineHooks

    eng = Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(max_slots=4)), warmup=False,
                        hooks=EngineHooks(forced_reply="Fine."))
    yield eng
    eng.close()


def test_history_image_is_preprocessed_once_and_never_on_the_engine_thread(engine):
    """A conversation with a 1024x768 image: its preprocessing runs on an input worker, once; the next turns
    (the image in the history) reuse the cached pixels or, with the slot holding it, skip them."""
    inputs = engine._thinker.inputs
    threads = []
    real = engine.bundle.vision_input

    def spy(image):
        threads.append(threading.current_thread().name)
        return real(image)

    engine.bundle.vision_input = spy
    try:
        image = _image(3)
        history = [Message("user", (Content.of_image(image), Content.of_text("What is this?")))]
        for turn in range(3):
            done = threading.Event()
            events = []
            engine.submit(TurnRequest(f"t{turn}", "conv", tuple(history), sampling=SamplingParams(max_tokens=3),
                                      with_audio=False),
                          lambda ev, events=events, done=done: (events.append(ev), ev.__class__.__name__ in (
                              "TurnDone", "TurnFailed") and done.set()))
            assert done.wait(60)
            assert type(events[-1]).__name__ == "TurnDone", events[-1]
            history += [Message("assistant", (Content.of_text(events[-1].text),)),
                        Message("user", (Content.of_text(f"And now {turn}?"),))]
        assert len(threads) == 1 and threads[0].startswith("realtime-ming-inputs"), threads
        engine.close_conversation("conv")  # the slot is gone: the next turn prefills the image again ...
        fresh = [Message("user", (Content.of_image(image.copy()), Content.of_text("Again?")))]  # ... same pixels
        done = threading.Event()
        engine.submit(TurnRequest("t-fresh", "conv", tuple(fresh), sampling=SamplingParams(max_tokens=3),
                                  with_audio=False),
                      lambda ev: ev.__class__.__name__ in ("TurnDone", "TurnFailed") and done.set())
        assert done.wait(60)
        assert len(threads) == 1 and inputs.cache.hits >= 1  # from the content cache, not preprocessed again
    finally:
        engine.bundle.vision_input = real
