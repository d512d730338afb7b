"""A talker replica's row state (`engine/talker_rows.py`): batched row moves give exactly the per-row result, in a
number of ops that does not grow with the moves; the runner's compaction keeps each stream's state (issue 45)."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from realtime_ming.engine.config import EngineConfig, TalkerRunnerConfig
from realtime_ming.engine.talker_replica import first_replica
from realtime_ming.engine.talker_rows import TalkerRows
from realtime_ming.engine.talker_runner import TalkerRunner
from realtime_ming.engine.talker_sync import TalkerStreams

ROWS = 8
COPIES = {"copy_", "index_copy_", "index_select", "clone", "index_put_", "gather", "scatter_"}


def _rows(bundle) -> TalkerRows:
    replica = first_replica(bundle)
    cpu = torch.device("cpu")
    return TalkerRows(replica.talker, replica.vae, bundle.cfg.talker, ROWS, 64, TalkerStreams(cpu, cpu),
                      device=cpu, vae_device=cpu, dtype=bundle.dtype)


def _randomize(rows: TalkerRows, gen: torch.Generator) -> None:
    """Every row's every state tensor random (each row different)."""
    for r in range(ROWS):
        for view in rows.talker_views(r) + rows.vae_views(r):
            if view.dtype == torch.bool:
                view.copy_(torch.randint(0, 2, view.shape, generator=gen).bool())
            elif view.dtype == torch.int64:
                view.copy_(torch.randint(-1, 1000, view.shape, generator=gen))
            else:
                view.copy_(torch.randn(view.shape, generator=gen).to(view.dtype))


def _state(rows: TalkerRows) -> list[list[torch.Tensor]]:
    return [[v.clone() for v in rows.talker_views(r) + rows.vae_views(r)] for r in range(rows.h.shape[0])]


def _assert_rows(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> None:
    for r, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            assert torch.equal(a, b), (r, i)


def _move_sets(rnd: random.Random) -> list[list[tuple[int, int]]]:
    """Chains (a->b->c), swaps, cycles, fan-out (one source, several rows) and random partial maps."""
    sets = [[(0, 1), (1, 2), (2, 3)], [(2, 5), (5, 2)], [(1, 4), (4, 6), (6, 1)], [(3, 0), (3, 1), (3, 7)], [(6, 6)]]
    for _ in range(20):
        k = rnd.randint(1, ROWS)
        dsts = rnd.sample(range(ROWS), k)
        sets.append([(rnd.randrange(ROWS), d) for d in dsts])
    return sets


def test_batched_moves_give_the_per_row_result(tiny_bundle):
    """Row dst gets what row src held before any move: the same bytes as copying each source row out first and
    putting each copy in its row one at a time."""
    rows, gen, rnd = _rows(tiny_bundle), torch.Generator().manual_seed(0), random.Random(0)
    for pairs in _move_sets(rnd):
        _randomize(rows, gen)
        before = _state(rows)
        want = [list(r) for r in before]
        for src, dst in pairs:
            want[dst] = before[src]
        rows.moves(pairs)
        _assert_rows(_state(rows), want)
    with pytest.raises(ValueError, match="twice"):
        rows.moves([(0, 1), (2, 1)])


def test_a_single_move_copies_one_row(tiny_bundle):
    rows, gen = _rows(tiny_bundle), torch.Generator().manual_seed(1)
    _randomize(rows, gen)
    before = _state(rows)
    rows.move(0, 3)
    want = list(before)
    want[3] = before[0]
    _assert_rows(_state(rows), want)


class _CopyCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.copies += func.overloadpacket.__name__ in COPIES
        return func(*args, **(kwargs or {}))


def test_a_batch_of_row_moves_costs_a_fixed_number_of_copies(tiny_bundle):
    """k row moves (k >= 2) issue one gather and one scatter per state tensor, not k copies per tensor."""
    rows = _rows(tiny_bundle)
    tensors = len(rows.talker_views(0) + rows.vae_views(0))
    counts = {}
    for k in range(2, ROWS + 1):
        with _CopyCount() as mode:
            rows.moves([(i, (i + 1) % k) for i in range(k)])  # a cycle over k rows
        counts[k] = mode.copies
    assert set(counts.values()) == {2 * tensors}, counts
    with _CopyCount() as mode:
        rows.move(1, 5)
    assert mode.copies == tensors


class _Stream:
    def __init__(self, name: str):
        self.name = name


def test_removing_streams_keeps_each_survivors_state(tiny_bundle):
    """The runner's compaction (`_remove`): each surviving stream's row state follows it to its new row, the same
    streams in the same order as the one-at-a-time refill from the last row, and the freed rows' VAE state is
    fresh."""
    runner = TalkerRunner(tiny_bundle, EngineConfig(talker=TalkerRunnerConfig(max_streams=ROWS)))
    gen, rnd = torch.Generator().manual_seed(2), random.Random(2)
    for _ in range(15):
        n = rnd.randint(1, ROWS)
        runner.streams = [_Stream(f"s{i}") for i in range(n)]
        _randomize(runner.rows, gen)
        state = {s.name: row for s, row in zip(runner.streams, _state(runner.rows))}
        gone = rnd.sample(range(n), rnd.randint(1, n))
        expected = list(runner.streams)
        for i in sorted(gone, reverse=True):  # the refill order the runner has always used
            expected[i] = expected[-1]
            expected.pop()
        runner._remove(gone)
        assert [s.name for s in runner.streams] == [s.name for s in expected]
        now = _state(runner.rows)
        _assert_rows(now[:len(expected)], [state[s.name] for s in expected])
        vae = runner.rows.vae_state
        freed = list(range(len(expected), n))
        assert bool((vae.cache.slot_pos[freed] == -1).all()) and not bool(vae.has_held[freed].any())
        assert bool((vae.frame_pos[freed] == 0).all()) and not bool(vae.audio_buf[freed].any())
    runner.streams = []


def test_a_lead_whose_start_fails_leaves_the_running_streams_as_they_were(tiny_bundle):
    """A turn's first job takes the row after the leads (its stream moved to the next free row first); when its
    prefill fails the moved stream goes back to its row, state and all, and the turn gets an error."""
    runner = TalkerRunner(tiny_bundle, EngineConfig(talker=TalkerRunnerConfig(max_streams=4)))
    runner.enqueue("a", 0, "Hello there, how are you? Fine, thanks.", None, seed=1)
    runner.finish(runner.launch())  # "a" runs in row 0, no longer a lead
    streams, before = list(runner.streams), _state(runner.rows)

    def broken(*args, **kwargs):
        raise RuntimeError("prefill failed")

    runner.prefiller = broken
    moves, move = [], runner.rows.move
    runner.rows.move = lambda src, dst: (moves.append((src, dst)), move(src, dst))
    runner.enqueue("b", 0, "The sea is calm.", None, seed=2)
    (out,) = runner._admit()
    assert out.turn_id == "b" and "prefill failed" in out.error
    assert runner.streams == streams and moves == [(0, 1), (1, 0)]  # out of row 0 for the lead, and back
    _assert_rows(_state(runner.rows)[:1], before[:1])
    runner.cancel("a")
