"""Session leases of the direct data path: one-time tokens for a replica's own `websockets` port.

Serve's proxy obtains a lease through a Serve-routed streaming call on the replica deployment (so it
counts against `max_ongoing_requests` like a session), then connects to the replica's direct port with
the token in the `x-realtime-ming-lease` header. A token is secret (`secrets.token_urlsafe`, 256
bits), single use, and valid for `ttl_s` after it was issued; any request on the direct port without
a live token is refused with 403 before the upgrade (HTTP routes included). `LeaseGate.process_request`
is the `websockets` hook that checks it; the lease ends when the connection that claimed it closes (or
when it expires unclaimed), which ends the streaming call and frees the Serve slot. A replica with
front-end processes checks in each of them with `FrontendGate`, which asks the actor's book over the
engine host (cluster/replica_frontends.py).

Plain Python (no Ray), so it is testable alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import http
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from ..server.http import text_response

__all__ = ["CLAIM_CALL", "END_CALL", "LEASE_HEADER", "REPLICA_HEADER", "REPORT_CALL", "FrontendGate", "Lease",
           "LeaseBook", "LeaseGate"]

log = logging.getLogger(__name__)

LEASE_HEADER = "x-realtime-ming-lease"
REPLICA_HEADER = "x-realtime-ming-replica"  # on every accepted upgrade: the replica serving the session
_REFUSED = "This port serves only sessions admitted by the cluster's proxy.\n"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(eq=False)
class Lease:
    """One admitted session: its token until claimed, then the connection's life."""

    token: str
    expires_at: float  # time.monotonic() deadline for the claim
    claimed: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_done(self) -> bool:
        """Return once the lease is over: True after the claiming connection closed, False when the token
        expired unused (or was revoked). Cancel-safe."""
        remaining = self.expires_at - time.monotonic()
        if not self.claimed.is_set():
            try:
                async with asyncio.timeout(max(0.0, remaining)):
                    await self.claimed.wait()
            except TimeoutError:
                return False
        await self.ended.wait()
        return True


class LeaseBook:
    """The replica's outstanding tokens (by SHA-256 digest, so a lookup compares no secret)."""

    def __init__(self, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.ttl_s = ttl_s
        self._pending: dict[bytes, Lease] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def issue(self) -> Lease:
        self._expire()
        lease = Lease(secrets.token_urlsafe(32), time.monotonic() + self.ttl_s)
        self._pending[_digest(lease.token)] = lease
        return lease

    def claim(self, token: str | None) -> Lease | None:
        """The lease of `token`, taken out of the book (single use); None when unknown, used or expired."""
        self._expire()
        if not token:
            return None
        lease = self._pending.pop(_digest(token), None)
        if lease is None:
            return None
        lease.claimed.set()
        return lease

    def revoke(self, lease: Lease) -> None:
        """Withdraw an unclaimed token (its streaming call ended); a claimed lease is left to its connection."""
        if self._pending.get(_digest(lease.token)) is lease:
            del self._pending[_digest(lease.token)]
        if not lease.claimed.is_set():
            lease.ended.set()

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, lease in self._pending.items() if lease.expires_at <= now]:
            self._pending.pop(key).ended.set()


class LeaseGate:
    """`process_request` of the replica's direct port: a live token or 403 before anything else."""

    def __init__(self, book: LeaseBook) -> None:
        self.book = book
        self._watchers = _Watchers()
        self.refused = 0

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        tokens = request.headers.get_all(LEASE_HEADER)
        lease = self.book.claim(tokens[0]) if len(tokens) == 1 else None
        if lease is None:
            self.refused += 1
            return _refusal(connection)
        self._watchers.watch(connection, lease.ended.set)
        return None


def _refusal(connection: ServerConnection) -> Response:
    log.warning("direct port: refused a request without a valid lease token from %s", connection.remote_address)
    return text_response(http.HTTPStatus.FORBIDDEN, _REFUSED)


class _Watchers:
    """Runs `ended()` once each claimed connection has closed (the tasks kept until then)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def watch(self, connection: ServerConnection, ended: Callable[[], object]) -> None:
        task = asyncio.ensure_future(self._end_on_close(connection, ended))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _end_on_close(connection: ServerConnection, ended: Callable[[], object]) -> None:
        try:
            await connection.wait_closed()
        finally:
            ended()


# The engine-host calls of a replica's front ends (cluster/replica_frontends.py answers them in the actor)
CLAIM_CALL = "replica_lease_claim"  # (token) -> a lease key, or None
END_CALL = "replica_lease_end"  # (key): the connection that claimed it closed
REPORT_CALL = "replica_frontend_report"  # (index, metrics text)
_CLAIM_TIMEOUT_S = 10.0


class FrontendGate:
    """A replica's front-end process (`server.frontend_processes` >= 2 in a cluster replica): its direct-port
    connections arrive handed over by the actor, and the actor's `LeaseBook` judges their tokens. The same
    check as `LeaseGate` (one valid token or 403 before anything else), made over the engine host's calls;
    `serving(server)` then sends the actor this process's metrics every `report_interval_s`."""

    def __init__(self, engine, index: int, report_interval_s: float = 1.0) -> None:
        self.engine, self.index, self.report_interval_s = engine, index, report_interval_s
        self._watchers = _Watchers()
        self._reporter: asyncio.Task | None = None  # held: the loop keeps only a weak reference

    async def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        tokens = request.headers.get_all(LEASE_HEADER)
        key = None
        if len(tokens) == 1 and tokens[0]:
            future = self.engine.call_future(CLAIM_CALL, tokens[0])
            try:
                key = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), _CLAIM_TIMEOUT_S)
            except (RuntimeError, TimeoutError, asyncio.CancelledError) as exc:  # no admission
                # a claim the actor grants after all is ended at once: its Serve slot must not stay taken
                future.add_done_callback(self._end_late)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                log.warning("direct port: lease check failed: %r", exc)
        if key is None:
            return _refusal(connection)
        self._watchers.watch(connection, lambda: self.engine.call_future(END_CALL, key))
        return None

    def _end_late(self, future) -> None:
        if not future.cancelled() and future.exception() is None and future.result() is not None:
            self.engine.call_future(END_CALL, future.result())

    def serving(self, server) -> None:
        self._reporter = asyncio.ensure_future(self._report(server))

    async def _report(self, server) -> None:
        while True:
            try:
                self.engine.call_future(REPORT_CALL, self.index, server.metrics.render().decode())
            except Exception as exc:  # noqa: BLE001 - a lost report is replaced by the next one
                log.debug("front-end report failed: %s", exc)
            await asyncio.sleep(self.report_interval_s)
