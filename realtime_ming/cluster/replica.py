"""One Ray Serve replica: one engine, one `RealtimeServer`, served through the ASGI transport.

Sessions: each accepted `/v1/realtime` WebSocket is one Serve request for its whole life, so it
stays on this replica and counts against `max_ongoing_requests` (= the replica's capacity): Serve's
router never hands a new session to a full replica (the replica refuses above the limit and the
router tries another).

Draining: when Serve starts stopping this replica (scale-down, rolling upgrade, `serve shutdown`)
it stops routing to it and waits up to `graceful_shutdown_timeout_s` for its requests to end. The
replica notices the stop and drains like the single server on SIGTERM: new responses are refused,
responses in progress finish (within `server.limits.drain_timeout_s`), then the sessions close with
1001, the open requests end and Serve completes the stop. Serve has no public hook for "stopping
began"; the replica reads the flag of Ray Serve 2.60's replica object (`_shutting_down`), found
once at start. Without it (another Ray version) the drain still runs in `__del__`, after Serve's
own wait.

Data path (cluster config `data_path`): with `direct` (default) the replica also serves sessions on
its own `websockets` port (cluster/direct.py): the proxy middleware takes a lease through the
streaming `lease` call (one Serve request for the session's life, so admission is unchanged), then
relays the client's frames over one TCP connection to that port, with Ray off the per-frame path;
requests without a live one-time lease token are refused 403. With `server.frontend_processes` >= 2
the direct port's sessions run in that many front-end processes, as in `realtime-ming serve`, the actor
keeping the engine and the leases (cluster/replica_frontends.py): one process carries only about 32
real-time sessions. With `serve` the session is the WebSocket Serve's proxy hands the replica as ASGI,
every frame crossing Ray, in the actor's process. All run the same `RealtimeServer.serve_session`.

The upgrade response names the replica (`x-realtime-ming-replica`, its Serve replica id, as in
/health and /metrics), so a client or an operator can tell which replica serves a session.

Failure: a dead engine fails its responses (`engine_unavailable`), the sessions close with 1011 and
`check_health` fails, so Serve replaces the replica. A replica process that dies outright is
handled by the proxy middleware (cluster/proxy.py): its sessions get `replica_lost` and 1012.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from websockets.frames import CloseCode

from ..engine.hooks import EngineHooks
from .lease import REPLICA_HEADER

__all__ = ["REPLICA_HEADER", "RealtimeReplica", "replica_capacity"]

log = logging.getLogger(__name__)

_WATCH_S = 0.1  # how often the replica looks for "Serve is stopping me" and a dead engine


def replica_capacity(cfg) -> int:
    """Sessions one replica serves at once: min(server.limits.max_sessions, engine.thinker.max_slots)."""
    return max(1, min(cfg.server.limits.max_sessions, cfg.engine.thinker.max_slots))


def _serve_replica_impl() -> Any | None:
    """Ray Serve's replica object of this process (holds `_shutting_down`), or None."""
    for obj in gc.get_objects():
        if isinstance(obj, dict) or not hasattr(type(obj), "perform_graceful_shutdown"):
            continue  # the actor class is generated per deployment (ServeReplica:<app>:<deployment>)
        impl = getattr(obj, "_replica_impl", None)
        if impl is not None and hasattr(impl, "_shutting_down"):
            return impl
    return None


class RealtimeReplica:
    """The replica deployment's class (wrapped by `serve.ingress()` / `serve.deployment` in cluster/app.py)."""

    async def __init__(self, server_config: str | None, overrides: list[str], app_name: str,
                     report_interval_s: float, direct: dict[str, Any] | None = None,
                     hooks: EngineHooks | None = None) -> None:
        from ray import serve

        from ..server.app import RealtimeServer
        from ..server.asgi import RealtimeAsgiApp
        from ..server.config import TlsConfig
        from ..server.loading import load_engine
        from ..server.startup import prepare
        from .config import load_replica_config
        from .direct import DirectPort
        from .registry import registry_actor
        from .replica_frontends import ReplicaFrontEnds

        cfg = prepare(load_replica_config(server_config, overrides, "serve" if direct is None else "direct"))
        # TLS ends at Serve's proxy; the direct hop proxy -> replica is plain TCP inside the cluster
        cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, tls=TlsConfig()))
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        self.actor_name = context.replica_id.to_full_id_str()
        self.direct = DirectPort(**direct) if direct is not None else None
        self.engine = await asyncio.to_thread(load_engine, cfg, hooks)
        # with front-end processes they serve the direct port; else this process does
        here = self.direct is not None and cfg.server.frontend_processes == 1
        self.server = RealtimeServer(cfg, self.engine, sock=self.direct.sock if here else None,
                                     admit=self.direct.gate.process_request if here else None)
        self.asgi = RealtimeAsgiApp(self.server, accept_headers=[(REPLICA_HEADER, self.replica_id)])
        await self.asgi.ensure_prepared()
        self.frontends: ReplicaFrontEnds | None = None
        if here:
            await self.server.start()
        elif self.direct is not None:
            self.frontends = ReplicaFrontEnds(cfg, self.engine, self.direct, report_interval_s)
            await self.frontends.start()
        if self.direct is not None:
            log.info("replica %s: direct data path on %s (%d process(es))", self.replica_id, self.direct.address,
                     cfg.server.frontend_processes)
        self.capacity = replica_capacity(cfg)
        self._registry = registry_actor(app_name)
        self._report_interval_s = report_interval_s
        self._stopping = False
        self._drained = False
        self._serve_impl = await asyncio.to_thread(_serve_replica_impl)
        if self._serve_impl is None:
            log.warning("replica %s: Ray Serve's stop flag not found (not Ray 2.60?): the drain runs only "
                        "after Serve's own graceful_shutdown wait", self.replica_id)
        self._tasks = [asyncio.create_task(self._report_loop()), asyncio.create_task(self._watch())]
        log.info("replica %s ready: %d session(s) of capacity", self.replica_id, self.capacity)

    def __serve_build_asgi_app__(self):
        from ..server.asgi import asgi_request
        from .proxy import is_voices_path, voice_routes_refusal

        asgi = self.asgi

        async def app(scope, receive, send) -> None:
            if scope["type"] == "http" and is_voices_path(asgi_request(scope).path):
                await voice_routes_refusal(scope, send)  # without the proxy middleware (see cluster/proxy.py)
                return
            await asgi(scope, receive, send)

        return app

    async def lease(self) -> AsyncIterator[dict[str, Any]]:
        """Admission of a session on the direct data path (called by the proxy middleware with
        `stream=True`): yields {data_path: direct, host, port, token, replica}, then stays open until
        the session that used the token ends (or the token expires unused). A replica on the serve
        data path yields {data_path: serve} and ends: the proxy then relays through Serve."""
        if self.direct is None:
            yield {"data_path": "serve", "replica": self.replica_id}
            return
        async for grant in self.direct.grants(self.replica_id):
            yield grant

    # ---- state ---------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """What the front shows for this replica (/health, /v1/models, /metrics)."""
        server, frontends = self.server, self.frontends
        _, health = server._health("health")
        sessions = self._sessions()
        health["sessions"] = sessions
        if frontends is not None:
            health["frontend_processes"] = frontends.frontends.n
        return {
            "replica": self.replica_id,
            "actor_name": self.actor_name,
            "health": health,
            "alive": self._failure() is None,
            "draining": server.draining,
            "sessions": sessions,
            "capacity": self.capacity,
            "models": server._models(),
            "metrics": server.metrics.render().decode() if frontends is None else frontends.metrics(),
            "reported_at": time.time(),
        }

    def _sessions(self) -> int:
        return self.server.num_sessions if self.frontends is None else self.frontends.sessions

    def _failure(self) -> str | None:
        """Why this replica cannot serve: its engine died, or its front ends stopped (kept dying)."""
        reason = self.server.engine_failure()
        if reason is None and self.frontends is not None and self.frontends.ended:
            reason = "the front-end processes stopped"
        return reason

    async def _report_loop(self) -> None:
        """A report every `report_interval_s`, and one within `_WATCH_S` of a session opening or ending, so
        /health/ready turns 503 (and back) as the replica fills and frees, not an interval later."""
        reported, due = None, 0.0
        while True:
            if self._sessions() != reported or time.monotonic() >= due:
                reported, due = await self._report_now(), time.monotonic() + self._report_interval_s
            await asyncio.sleep(_WATCH_S)

    async def _watch(self) -> None:
        """Drain when Serve starts stopping this replica; close the sessions when the engine dies."""
        server = self.server
        while True:
            await asyncio.sleep(_WATCH_S)
            if self._serve_impl is not None and getattr(self._serve_impl, "_shutting_down", False):
                log.info("replica %s: Serve is stopping it: draining", self.replica_id)
                await self.drain()
                return
            reason = self._failure()
            if reason is not None:
                log.critical("replica %s: engine dead (%s): closing its sessions", self.replica_id, reason)
                server.begin_drain()
                await server.wait_responses_done(1.0)  # the engine failed them: let response.done go out
                await self.asgi.close_sessions(CloseCode.INTERNAL_ERROR, "model engine unavailable")
                await server.close(CloseCode.INTERNAL_ERROR, "model engine unavailable")  # the direct sessions
                if self.frontends is not None:  # they saw the engine die and closed theirs (1011) themselves
                    await self.frontends.stop()
                return

    async def drain(self) -> bool:
        """Refuse new sessions and responses, let responses in progress finish, close the sessions (1001)."""
        if self._drained:
            return True
        self._drained = True
        self.server.begin_drain()
        await self._report_now()  # /health shows `draining` from the start of the drain, not a report later
        drains = [self.asgi.drain(self.server.cfg.server.limits.drain_timeout_s)]  # sessions through Serve
        if self.frontends is not None:  # each front end drains as a single server does (exit code 0)
            drains.append(self._stop_frontends())
        done = all(await asyncio.gather(*drains))
        await self.server.close()  # the direct sessions: 1001 (their responses finished above)
        await self._report_now()
        return done

    async def _stop_frontends(self) -> bool:
        return await self.frontends.stop() == 0

    async def _report_now(self) -> int:
        """Report to the registry now; the sessions reported."""
        report = self.report()
        try:
            await self._registry.report.remote(self.replica_id, report)
        except Exception as exc:  # the registry restarts (max_restarts=-1): the next report goes again
            log.warning("replica %s: report failed: %s", self.replica_id, exc)
        return report["sessions"]

    async def check_health(self) -> None:
        """Serve's health check: a dead engine makes the replica unhealthy (Serve replaces it)."""
        reason = self._failure()
        if reason is not None:
            raise RuntimeError(f"replica unavailable: {reason}")

    async def __del__(self) -> None:
        if not hasattr(self, "_tasks"):  # the constructor failed: nothing was started
            return
        await self.drain()
        for task in self._tasks:
            task.cancel()
        try:
            await self._registry.forget.remote(self.replica_id)
        except Exception:
            pass
        await asyncio.to_thread(self.engine.close)
