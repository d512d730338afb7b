"""Talker data parallelism: one `TalkerRunner` per talker replica (`engine.placement.talker_devices`).

The talker's step (LM decode + CFG flow matching + aggregator + stop head, then the streaming VAE) over every
live stream bounds the engine step once ~30 streams speak: split over two GPUs, each replica steps half the
streams, and the engine waits for the slower half instead of the whole. `TalkerPool` has `TalkerRunner`'s
interface (what `engine.py` calls), so the engine does not know how many replicas there are:

* a turn is spoken by one replica for its whole life (its fragments run one after another on that replica's
  rows, in order): the replica is chosen at the turn's first segment, the one with the fewest live turns
  (turns assigned and not yet forgotten; ties: fewer running streams, then the lower index);
* `launch()` launches every replica's step (each on its own device and CUDA streams) before any is waited
  for, and `finish()` waits for each in turn and returns all their outputs;
* `engine.talker.max_streams` and the graph buckets are per replica: N replicas speak up to N x max_streams
  streams at once.

A stream's audio is its own (its noise generator is seeded by its turn's seed and job index, rows are batch
invariant, and every replica holds a copy of the same weights), so which replica speaks a turn changes nothing.
With one replica the engine uses a plain `TalkerRunner`, exactly as without this module.
"""

from __future__ import annotations

import logging
from typing import Callable

from .config import EngineConfig
from .models import ModelBundle
from .talker_replica import first_replica
from .talker_runner import TalkerOutput, TalkerRunner
from .talker_step import Progress
from .voice_store import CustomVoice

__all__ = ["TalkerPool", "make_talker"]

log = logging.getLogger(__name__)


def make_talker(bundle: ModelBundle, cfg: EngineConfig, member: Callable | None = None):
    """The engine's talker: one member for one replica, else a `TalkerPool` over all of them. A member is
    `member(replica)` (a `TalkerLoop` on a thread, `engine.talker.own_thread`, or a `TalkerProcess`,
    `engine.talker.own_process`), else the replica's `TalkerRunner`, stepped by the engine thread."""
    if len(bundle.talker_replicas) <= 1:
        return TalkerRunner(bundle, cfg) if member is None else member(first_replica(bundle))
    return TalkerPool(bundle, cfg, member)


class TalkerPool:
    """Runs on the engine thread only, except `drop`. Its members are the replicas' `TalkerRunner`s, or with
    `member` whatever it makes of each replica: a `TalkerLoop` (`engine.talker.own_thread`) or a `TalkerProcess`
    (`engine.talker.own_process`); then every replica steps on a thread (or in a process) of its own, at its own
    pace (one replica's host work runs beside the others' GPU work), the pool only routes a turn's calls to its
    replica, and `idle`, `drop` and `close` apply (the engine never calls `launch`/`finish`)."""

    def __init__(self, bundle: ModelBundle, cfg: EngineConfig, member: Callable | None = None):
        if not bundle.talker_replicas:
            raise ValueError("a talker pool needs the bundle's talker replicas")
        make = member or (lambda replica: TalkerRunner(bundle, cfg, replica))
        self.runners = []
        try:
            for replica in bundle.talker_replicas:
                self.runners.append(make(replica))
        except BaseException:
            self.close()  # the members started before the one that failed
            raise
        self._owner: dict = {}  # turn -> the member (runner or loop) speaking it (until `forget`)
        self._turns = {id(r): 0 for r in self.runners}  # live turns assigned to each replica

    # ---- bookkeeping --------------------------------------------------------------------------
    def enqueue(self, turn_id: str, segment_id: int, text: str, voice: str | CustomVoice | None, *,
                seed: int | None = None, caption: str | None = None) -> None:
        """`TalkerRunner.enqueue` on the turn's replica (chosen now at its first segment)."""
        runner = self._owner.get(turn_id)
        if runner is None:
            runner = min(self.runners, key=lambda r: (self._turns[id(r)], r.num_streams()))
            self._owner[turn_id] = runner
            self._turns[id(runner)] += 1
        runner.enqueue(turn_id, segment_id, text, voice, seed=seed, caption=caption)

    def replica_of(self, turn_id: str) -> int | None:
        """Index of the replica speaking `turn_id` (None before its first segment or after `forget`)."""
        runner = self._owner.get(turn_id)
        return None if runner is None else runner.replica.index

    def has_work(self) -> bool:
        return any(r.has_work() for r in self.runners)

    def pending(self, turn_id: str) -> bool:
        runner = self._owner.get(turn_id)
        return runner is not None and runner.pending(turn_id)

    def num_streams(self) -> int:
        return sum(r.num_streams() for r in self.runners)

    def forget(self, turn_id: str) -> None:
        """Drop a finished or cancelled turn (its rows on its replica are freed; the replica's load drops)."""
        runner = self._owner.pop(turn_id, None)
        if runner is not None:
            self._turns[id(runner)] -= 1
            runner.forget(turn_id)

    def cancel(self, turn_id: str) -> None:
        """Stop the turn's talker work (queued jobs and its running stream); it stays on its replica."""
        runner = self._owner.get(turn_id)
        if runner is not None:
            runner.cancel(turn_id)

    def pause(self, turn_id: str) -> None:
        """`TalkerRunner.pause` on the turn's replica (a turn that has audio has one)."""
        runner = self._owner.get(turn_id)
        if runner is not None:
            runner.pause(turn_id)

    def resume(self, turn_id: str) -> None:
        runner = self._owner.get(turn_id)
        if runner is not None:
            runner.resume(turn_id)

    def capture(self, progress: Progress | None = None) -> None:
        """Every replica's graphs, one replica after the other (each on its own device)."""
        for runner in self.runners:
            runner.capture(progress)

    # ---- replicas on threads of their own (members are `TalkerLoop`s) ----------------------------------------
    def idle(self, event) -> None:
        """A replica's `Idle` report, recorded by that replica's loop (a forgotten turn's is ignored)."""
        runner = self._owner.get(event.turn_id)
        if runner is not None:
            runner.idle(event)

    def drop(self, turn_id: str) -> None:
        """Any thread: no replica delivers more output of `turn_id` (the owner map is the engine thread's)."""
        for runner in self.runners:
            runner.drop(turn_id)

    def close(self) -> None:
        for runner in self.runners:
            close = getattr(runner, "close", None)  # an engine-stepped runner holds no thread
            if close is not None:
                close()

    # ---- stepping ----------------------------------------------------------------------------
    def step(self) -> list[TalkerOutput]:
        return self.finish(self.launch())

    def launch(self, steps: int = 1) -> list:
        """Launch every replica's `steps` steps before waiting for any (each replica's GPU work runs beside the others').
        If one fails to launch, the replicas launched before it are finished (their outputs dropped: the engine
        fails the turns in flight) so every replica stays consistent, and the error propagates."""
        launched = []
        for runner in self.runners:
            try:
                launched.append(runner.launch(steps))
            except BaseException:
                for done, step in zip(self.runners, launched):
                    try:
                        done.finish(step)
                    except Exception as exc:  # the first error is the one reported
                        log.debug("talker replica %d: finishing after a failed launch: %s", done.replica.index, exc)
                raise
        return launched

    def finish(self, launched: list) -> list[TalkerOutput]:
        """Wait for each replica's step and return every output (replica order). Every replica is finished even
        when one fails (each stays consistent); then the first failure propagates."""
        outputs: list[TalkerOutput] = []
        error: BaseException | None = None
        for runner, step in zip(self.runners, launched, strict=True):
            try:
                outputs += runner.finish(step)
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error
        return outputs
