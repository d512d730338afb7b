"""Talker data parallelism: one `TalkerRunner` per talker replica (`engine.placement.talker_devices`).

The talker's step (LM decode + CFG flow matching + aggregator + stop head, then the streaming VAE) over every
live stream bounds the engine step once ~30 streams speak: split over two GPUs, each replica steps half the
streams, and the engine waits for the slower half instead of the whole. `TalkerPool` is a `TalkerDriver`
(`engine/talker_driver.py`) over one driver per replica (inline or process), so the engine does not know how many
replicas there are:

* a turn is spoken by one replica for its whole life (its fragments run one after another on that replica's
  rows, in order): the replica is chosen at the turn's first segment, the one with the fewest live turns
  (turns assigned and not yet forgotten; ties: fewer running streams, then the lower index);
* `launch()` launches every inline replica's step (each on its own device and CUDA streams) before any is waited
  for, and `outputs()` waits for each in turn and returns all their outputs (a replica in a process of its own
  steps itself: the pool only routes its calls);
* `engine.talker.max_streams` and the graph buckets are per replica: N replicas speak up to N x max_streams
  streams at once.

A stream's audio is its own (its noise generator is seeded by its turn's seed and job index, rows are batch
invariant, and every replica holds a copy of the same weights), so which replica speaks a turn changes nothing.
With one replica the engine uses that replica's driver alone.
"""

from __future__ import annotations

import logging
from typing import Callable

from .config import EngineConfig
from .models import ModelBundle
from .talker_driver import Enqueue, TalkerDriver
from .talker_inline import InlineTalker
from .talker_process import ProcessTalker, warn_shared_gpus
from .talker_replica import first_replica
from .talker_runner import TalkerOutput, TalkerRunner
from .talker_step import Progress

__all__ = ["TalkerPool", "make_talker"]

log = logging.getLogger(__name__)


def make_talker(bundle: ModelBundle, cfg: EngineConfig, deliver: Callable[[list[TalkerOutput]], None],
                wake: Callable[[], None], die: Callable[[str], None]) -> TalkerDriver:
    """The engine's talker (`engine.talker.driver`): one driver per talker replica, inline (the engine thread steps
    it) or in a process of its own (PCM to `deliver` from its reader thread, `wake` when it has notices, `die` when
    the process is gone); a `TalkerPool` of them for several replicas."""
    if cfg.talker.driver == "process":
        warn_shared_gpus(bundle, cfg)
        member = lambda replica: ProcessTalker(bundle, cfg, replica, deliver, wake, die)  # noqa: E731
    else:
        member = lambda replica: InlineTalker(TalkerRunner(bundle, cfg, replica), cfg.talker.pipeline)  # noqa: E731
    if len(bundle.talker_replicas) <= 1:
        return member(first_replica(bundle))
    members = []
    try:
        for replica in bundle.talker_replicas:
            members.append(member(replica))
    except BaseException:
        for started in members:  # the members started before the one that failed
            started.close()
        raise
    return TalkerPool(members)


class TalkerPool:
    """A `TalkerDriver` over one driver per replica (all inline or all in processes): it routes each turn's calls to
    its replica's driver; `launch` launches every inline replica's step before `outputs` waits for any. Engine thread
    only, except `drop`."""

    def __init__(self, members: list):
        if not members:
            raise ValueError("a talker pool needs at least one member")
        self.members = list(members)
        self._owner: dict = {}  # turn -> the member speaking it (until `forget`)
        self._turns = {id(m): 0 for m in self.members}  # live turns assigned to each replica

    # ---- bookkeeping --------------------------------------------------------------------------
    def enqueue(self, op: Enqueue) -> None:
        """Enqueue on the turn's replica (chosen now at its first segment)."""
        member = self._owner.get(op.turn_id)
        if member is None:
            member = min(self.members, key=lambda m: (self._turns[id(m)], m.num_streams()))
            self._owner[op.turn_id] = member
            self._turns[id(member)] += 1
        member.enqueue(op)

    def replica_of(self, turn_id: str) -> int | None:
        """Index of the replica speaking `turn_id` (None before its first segment or after `forget`)."""
        member = self._owner.get(turn_id)
        return None if member is None else member.replica.index

    def has_work(self) -> bool:
        return any(m.has_work() for m in self.members)

    def pending(self, turn_id: str) -> bool:
        member = self._owner.get(turn_id)
        return member is not None and member.pending(turn_id)

    def num_streams(self) -> int:
        return sum(m.num_streams() for m in self.members)

    def forget(self, turn_id: str) -> None:
        """Drop a finished or cancelled turn (its rows on its replica are freed; the replica's load drops)."""
        member = self._owner.pop(turn_id, None)
        if member is not None:
            self._turns[id(member)] -= 1
            member.forget(turn_id)

    def pause(self, turn_id: str) -> None:
        """Pause on the turn's replica (a turn that has audio has one)."""
        member = self._owner.get(turn_id)
        if member is not None:
            member.pause(turn_id)

    def resume(self, turn_id: str) -> None:
        member = self._owner.get(turn_id)
        if member is not None:
            member.resume(turn_id)

    def drop(self, turn_id: str) -> None:
        """Any thread: no replica delivers more output of `turn_id` (the owner map is the engine thread's)."""
        for member in self.members:
            member.drop(turn_id)

    def capture(self, progress: Progress | None = None) -> None:
        """Every replica's graphs, one replica after the other (each on its own device)."""
        for member in self.members:
            member.capture(progress)

    def stats(self) -> dict | None:
        """The members' loop totals summed (None when no member keeps any)."""
        total: dict | None = None
        for member in self.members:
            for key, value in (member.stats() or {}).items():
                total = total if total is not None else {}
                total[key] = total.get(key, 0) + value
        return total

    def close(self) -> None:
        for member in self.members:
            member.close()

    # ---- stepping ----------------------------------------------------------------------------
    def launch(self) -> None:
        """Launch every replica's step before waiting for any (each replica's GPU work runs beside the others').
        If one fails to launch, the replicas launched before it are finished (their outputs dropped: the engine
        fails the turns in flight) so every replica stays consistent, and the error propagates."""
        for i, member in enumerate(self.members):
            try:
                member.launch()
            except BaseException:
                for done in self.members[:i]:
                    try:
                        done.outputs()
                    except Exception as exc:  # the first error is the one reported
                        log.debug("talker replica %d: finishing after a failed launch: %s", done.replica.index, exc)
                raise

    def outputs(self) -> list[TalkerOutput]:
        """Wait for each replica's step and return every output (replica order). Every replica is finished even
        when one fails (each stays consistent); then the first failure propagates."""
        outputs: list[TalkerOutput] = []
        error: BaseException | None = None
        for member in self.members:
            try:
                outputs += member.outputs()
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error
        return outputs
