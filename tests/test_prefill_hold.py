"""A long prompt beside streaming rows on a CPU (issue 43, finding 9): its chunks are held so that the decoding rows
get decode-only steps between them, a new prompt is never held, and a short row decodes apart from a long one.
The host's time is simulated (each forward advances a fake clock), so the schedule is asserted, not wall time."""

from __future__ import annotations

import pytest
import torch

from realtime_ming.engine.models import ModelBundle
from realtime_ming.engine.prefill_pace import PrefillPace
from realtime_ming.engine.thinker_decode import ThinkerDecoder, kv_groups
from realtime_ming.engine.thinker_runner import ThinkerRunner
from realtime_ming.model.thinker import ThinkerKVCache

from engine_support import _config, _request

pytestmark = pytest.mark.timeout(180)

CHUNK_S, DECODE_S = 0.375, 0.125  # simulated host time of a prefill forward and of a decode step (exact in binary)
LONG = " ".join(f"word{i}" for i in range(16))  # a prompt of many chunks of 16 tokens


@pytest.fixture(scope="module")
def bundle(fixture_root) -> ModelBundle:
    return ModelBundle.load(_config(fixture_root))


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class _Timed:
    """The thinker, each prefill forward advancing the clock by CHUNK_S (attributes pass through)."""

    def __init__(self, model, clock: _Clock) -> None:
        self._model, self._clock = model, clock

    def __call__(self, *args, **kwargs):
        self._clock.t += CHUNK_S
        return self._model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


def _runner(bundle, fixture_root, **thinker) -> tuple[ThinkerRunner, _Clock]:
    runner = ThinkerRunner(bundle, _config(fixture_root, prefill_chunk_tokens=16, **thinker))
    clock = _Clock()
    runner.pace.clock = clock
    runner.model = _Timed(runner.model, clock)
    step = runner.decoder.step

    def timed_step(*args):
        clock.t += DECODE_S
        return step(*args)

    runner.decoder.step = timed_step
    return runner, clock


def _schedule(runner: ThinkerRunner, turn_id: str, steps: int) -> list[str]:
    """Per step: "C" a chunk of `turn_id`'s prompt ran, "D" only decoding rows stepped, "c" a chunk of
    another prompt; stops once `turn_id`'s prompt is complete."""
    out = []
    for _ in range(steps):
        row = runner.scheduler.rows[turn_id]
        before = row.offset
        others = {t: r.offset for t, r in runner.scheduler.rows.items() if t != turn_id}
        launched = runner.launch()
        runner.collect(launched)
        moved = any(r.offset != others.get(t, r.offset) for t, r in runner.scheduler.rows.items() if t != turn_id)
        out.append("C" if row.offset != before else "c" if moved else "D")
        if row.prefill is None:
            return out
    raise AssertionError(f"{turn_id}'s prompt not complete after {steps} steps: {''.join(out)}")


def _streaming(runner: ThinkerRunner, turn_id: str = "stream") -> None:
    runner.admit(_request(turn_id, "Count slowly.", max_tokens=400, with_audio=False))
    while runner.scheduler.prefill_queue:
        runner.step()
    assert [r.request.turn_id for r in runner.scheduler.decoding()] == [turn_id]


def test_a_long_prompt_beside_a_stream_waits_its_own_chunk_time_between_chunks(bundle, fixture_root):
    runner, _ = _runner(bundle, fixture_root)
    _streaming(runner)
    runner.admit(_request("image", LONG, max_tokens=4, with_audio=False))
    chunks = len(runner.scheduler.rows["image"].tail_ids) // 16
    assert chunks >= 4
    schedule = "".join(_schedule(runner, "image", 20 * chunks))
    # a chunk (0.375 s) then decode-only steps (0.125 s each) until 0.375 s have passed since it: the step with the
    # chunk decodes too, so two decode-only steps follow each chunk, and the stream keeps decoding throughout
    assert schedule.startswith("CDDC") and schedule.endswith("C")
    assert schedule.replace("CDD", "") == "C", schedule
    assert "stream" in runner.scheduler.rows and runner.scheduler.rows["stream"].next_token is not None


def test_a_new_prompt_prefills_while_a_long_one_is_held(bundle, fixture_root):
    runner, _ = _runner(bundle, fixture_root)
    _streaming(runner)
    runner.admit(_request("image", LONG, max_tokens=4, with_audio=False))
    runner.collect(runner.launch())  # the image's first chunk; it is held now
    assert runner.scheduler.rows["image"].offset == 16 and runner.pace.holds()
    runner.admit(_request("short", "Hi.", max_tokens=4, with_audio=False))
    launched = runner.launch()  # the held step still prefills the prompt that has had no chunk yet
    runner.collect(launched)
    assert launched.chunk and runner.scheduler.rows["short"].offset > 0
    assert runner.scheduler.rows["image"].offset == 16


def test_without_decoding_rows_or_with_the_pace_off_every_step_runs_a_chunk(bundle, fixture_root):
    runner, _ = _runner(bundle, fixture_root)
    runner.admit(_request("image", LONG, max_tokens=4, with_audio=False))
    assert set(_schedule(runner, "image", 100)) == {"C"}  # nothing to interleave with: never held
    runner, _ = _runner(bundle, fixture_root, prefill_step_ms=0.0)
    _streaming(runner)
    runner.admit(_request("image", LONG, max_tokens=4, with_audio=False))
    assert set(_schedule(runner, "image", 100)) == {"C"}  # the pace off: the hold is off too


def test_prefill_pace_holds_for_the_last_chunks_host_time():
    clock = _Clock()
    pace = PrefillPace(step_ms=250.0, max_tokens=256, clock=clock)
    assert not pace.holds()  # no chunk yet
    pace.observe(256, 0.5)
    assert pace.holds()
    clock.t += 0.49
    assert pace.holds()
    clock.t += 0.01
    assert not pace.holds()
    off = PrefillPace(step_ms=0.0, max_tokens=256, clock=clock)
    off.observe(256, 0.5)
    assert not off.holds()


def test_kv_groups_keep_a_short_row_out_of_a_long_rows_length():
    assert kv_groups([100, 4196, 120], 8192) == [[1], [2, 0]]
    assert kv_groups([100, 120, 60], 8192) == [[1, 0, 2]]  # one 128-position read serves all three
    assert kv_groups([1000, 2100, 4000], 8192) == [[2, 1], [0]]  # 2,112 of 4,032 is over half: together
    assert kv_groups([5], 8192) == [[0]]


def test_cpu_decode_in_length_groups_gives_the_batched_logits(bundle):
    torch.manual_seed(0)
    cache = ThinkerKVCache.allocate(bundle.thinker.cfg, 4, 512)
    cache.k.normal_()
    cache.v.normal_()
    decoder = ThinkerDecoder(bundle.thinker, cache, (1, 2, 4), (512,), device="cpu")
    tokens, positions, slots = [5, 6, 7], [20, 400, 30], [0, 1, 2]
    grouped = decoder.step(tokens, positions, [0, 0, 0], slots).clone()
    assert len(kv_groups(positions, 512)) == 2
    alone = torch.cat([decoder.step([t], [p], [0], [s]) for t, p, s in zip(tokens, positions, slots)])
    torch.testing.assert_close(grouped, alone, rtol=1e-5, atol=1e-5)
