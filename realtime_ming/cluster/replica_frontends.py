"""A replica's front-end processes (`server.frontend_processes` >= 2 on the direct data path).

One interpreter carries about `ONE_PROCESS_SESSIONS` real-time sessions (cluster/config.py), so a replica
serves its direct port as `realtime-ming serve` does with front ends (server/frontends.py): the actor keeps
the engine and hosts it (`EngineHost`), accepts on the direct port and hands each connection to the
least-loaded front end; the front ends run the sessions. What the cluster adds, over the engine host's
calls (names in cluster/lease.py):

- leases: a front end's `FrontendGate` asks the actor to claim the request's token in the replica's
  `LeaseBook` (the one the streaming `lease` call waits on) and tells it when that connection closed;
  a front end that dies ends the leases it held, so the Serve slot of each of its sessions is freed;
- reports: each front end sends its metrics; the replica reports their sum and the host's session count.

A front end that loses the engine host (the actor died: a replica kill, its node lost) exits at once and
its connections drop, so the proxy tells each client `replica_lost` (1012), as for a one-process replica.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import shutil
import threading

from ..server.config import ServerConfig
from ..server.frontends import FrontEnds, new_engine_host
from .direct import DirectPort
from .lease import CLAIM_CALL, END_CALL, REPORT_CALL, FrontendGate, Lease
from .metrics import sum_expositions

__all__ = ["ReplicaFrontEnds"]

log = logging.getLogger(__name__)

_CLAIM_WAIT_S = 5.0


class ReplicaFrontEnds:
    """Hosts the replica's engine for its front ends and supervises them (create, then `await start()`)."""

    def __init__(self, cfg: ServerConfig, engine, direct: DirectPort, report_interval_s: float) -> None:
        self.host, self._folder = new_engine_host(cfg, engine)
        self.host.peer_calls.update({CLAIM_CALL: self._claim, END_CALL: self._end, REPORT_CALL: self._report})
        self.host.hang_up_hooks.append(self._hung_up)
        gate = functools.partial(FrontendGate, report_interval_s=max(1.0, report_interval_s))
        self.frontends = FrontEnds(cfg, direct.sock, self.host, gate=gate)
        self.book = direct.book
        self._lock = threading.Lock()
        self._keys = itertools.count(1)
        self._claimed: dict[int, tuple[str, Lease]] = {}  # key -> (front end's peer name, lease)
        self._metrics: dict[str, str] = {}  # peer name -> its last metrics text
        self._merged: str | None = None  # their sum, None once one changed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._supervisor: asyncio.Future | None = None

    async def start(self) -> None:
        """Start the host and every front end, then supervise them on a thread (StartupError: one cannot start)."""
        self._loop = asyncio.get_running_loop()
        self.host.start()
        try:
            await asyncio.to_thread(self.frontends.start)
        except BaseException:
            self._close_host()
            raise
        self._supervisor = asyncio.ensure_future(asyncio.to_thread(self.frontends.supervise))
        log.info("replica front ends: %d processes (pids %s)", self.frontends.n, self.frontends.pids)

    @property
    def ended(self) -> bool:
        """The supervision ended on its own (the engine died, or the front ends kept dying)."""
        return self._supervisor is not None and self._supervisor.done()

    @property
    def sessions(self) -> int:
        return self.host.sessions

    def metrics(self) -> str:
        """The front ends' metrics summed (parsed again only after a front end reported: this process runs the
        engine thread)."""
        with self._lock:
            if self._merged is None:
                self._merged = sum_expositions(list(self._metrics.values()))
            return self._merged

    async def stop(self) -> int | None:
        """Drain the front ends (responses in progress finish within the drain timeout, sessions close 1001)
        and stop the host; the supervision's exit code."""
        code = None
        if self._supervisor is not None:
            if not self._supervisor.done():
                self.frontends.request_stop()
            code = await asyncio.shield(self._supervisor)
        self._close_host()
        return code

    def _close_host(self) -> None:
        self.host.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    # ---- the front ends' calls (engine-host call threads) ------------------------------------------------
    def _claim(self, peer: str, token: str) -> int | None:
        lease = asyncio.run_coroutine_threadsafe(self._claim_on_loop(token), self._loop).result(_CLAIM_WAIT_S)
        if lease is None:
            return None
        with self._lock:
            key = next(self._keys)
            self._claimed[key] = (peer, lease)
        return key

    async def _claim_on_loop(self, token: str) -> Lease | None:
        return self.book.claim(token)

    def _end(self, peer: str, key: int) -> bool:
        with self._lock:
            entry = self._claimed.get(key)
            if entry is None or entry[0] != peer:
                return False
            del self._claimed[key]
        self._loop.call_soon_threadsafe(entry[1].ended.set)
        return True

    def _report(self, peer: str, index: int, text: str) -> bool:
        with self._lock:
            if self._metrics.get(peer) != text:
                self._metrics[peer] = text
                self._merged = None
        return True

    def _hung_up(self, peer: str) -> None:
        """A front end hung up or died: its sessions are gone, so are their leases and its metrics."""
        with self._lock:
            keys = [key for key, (owner, _) in self._claimed.items() if owner == peer]
            leases = [self._claimed.pop(key)[1] for key in keys]
            if self._metrics.pop(peer, None) is not None:
                self._merged = None
        for lease in leases:
            self._loop.call_soon_threadsafe(lease.ended.set)
        if leases:
            log.warning("%s hung up: %d lease(s) ended", peer, len(leases))
