"""The cluster's plain-HTTP side (a small Serve deployment at `/`): /health, /v1/models, /metrics, the demo.

It answers from the replicas' reports in the registry (refreshed every `report_interval_s`) and
Serve's own view of the replica deployment, through the same `HttpRoutes` as a single server. A
replica is `healthy` (engine alive, not draining, reported within `replica_stale_s`), `draining`
or `down` (engine dead, or silent: the process or its node died).

`/health` is 200 while at least one replica is healthy (`status` ok, or degraded when some are not),
else 503; `/health/ready` is 200 while a healthy replica has a free session slot; `/health/live`
is 200 while any replica is alive.

The replicas' reports are read every `report_interval_s`, and afresh for a `/health` request when
the last read is older than `_FRESH_S` (0.1 s, so a probe flood costs the registry at most ten reads
a second). A replica reports within 0.1 s of a session opening or ending, so `/health/ready` follows
admission closely. While the registry cannot be read the reports keep ageing, so a replica is called
down `replica_stale_s` after its last report. Serve's own view of the deployment (`serve.status()`,
a controller call that costs the front and the controller CPU) is read, and old reports pruned,
every `_SLOW_EVERY` refreshes (5 s at the default 0.5 s): Serve's replica states change on the scale
of replica starts and stops, and on a small node that CPU is the models'.
"""

from __future__ import annotations

import asyncio
import http
import logging
import time
from typing import Any

__all__ = ["ClusterFront", "replica_states"]

log = logging.getLogger(__name__)

_SLOW_EVERY = 10  # refreshes between two reads of Serve's status (and two prunes of the registry)
_FRESH_S = 0.1  # a /health request re-reads reports older than this
_FRESH_WAIT_S = 1.0  # ... waiting this long for the registry before answering from what it has


def replica_states(reports: dict[str, dict[str, Any]], stale_s: float) -> dict[str, str]:
    """replica id -> healthy / draining / down."""
    states = {}
    for rid, report in reports.items():
        if report.get("age_s", 0.0) > stale_s or not report.get("alive", False):
            states[rid] = "down"
        elif report.get("draining"):
            states[rid] = "draining"
        else:
            states[rid] = "healthy"
    return states


class _ClusterMetrics:
    """`HttpRoutes`' metrics object: `render()` is the cluster exposition."""

    def __init__(self, front: ClusterFront) -> None:
        self._front = front

    def render(self) -> bytes:
        from .metrics import render_cluster_metrics

        reports = self._front.current_reports()
        return render_cluster_metrics(list(reports.values()), replica_states(reports, self._front.stale_s))


class ClusterFront:
    """The front deployment's class (wrapped by `serve.ingress()` / `serve.deployment` in cluster/app.py)."""

    async def __init__(self, app_name: str, replica_deployment: str, report_interval_s: float,
                       replica_stale_s: float, web_dir: str | None = None) -> None:
        from ..server.asgi import RealtimeAsgiApp  # noqa: F401 (the same ASGI helpers as a replica)
        from ..server.http import HttpRoutes, default_web_roots
        from .registry import registry_actor

        self.app_name = app_name
        self.replica_deployment = replica_deployment
        self.stale_s = replica_stale_s
        self._interval_s = report_interval_s
        self._registry = registry_actor(app_name)
        self.reports: dict[str, dict[str, Any]] = {}
        self._read_at = time.monotonic()  # when `reports` came from the registry
        self._reading: asyncio.Future | None = None
        self.serve_view: dict[str, Any] = {}
        self.routes = HttpRoutes(metrics=_ClusterMetrics(self), health=self.health, models=self.models,
                                 web_roots=default_web_roots(web_dir))
        await self._refresh()
        self._task = asyncio.create_task(self._refresh_loop())

    def __serve_build_asgi_app__(self):
        from ..server.asgi import asgi_request
        from ..server.http import text_response

        async def app(scope, receive, send) -> None:
            if scope["type"] == "lifespan":
                while (message := await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
                return
            if scope["type"] != "http":  # a WebSocket to any path but /v1/realtime
                await send({"type": "websocket.close", "code": 1008, "reason": ""})
                return
            request = asgi_request(scope)
            if request.path.startswith("/health"):
                await self._fresh_reports()
            response = await self.routes.respond(request)
            if response is None:
                response = text_response(http.HTTPStatus.NOT_FOUND, "Not found.\n")
            headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.raw_items()]
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            await send({"type": "http.response.body", "body": bytes(response.body)})

        return app

    async def _refresh(self, slow: bool = True) -> None:
        try:
            self.reports = await self._registry.snapshot.remote()
            self._read_at = time.monotonic()
            if slow:
                await self._registry.prune.remote(max(60.0, 10 * self.stale_s))
        except Exception as exc:
            log.warning("registry unavailable: %s", exc)
        if not slow:
            return
        try:
            self.serve_view = await asyncio.to_thread(self._serve_status)
        except Exception as exc:
            self.serve_view = {"error": str(exc)}

    def _serve_status(self) -> dict[str, Any]:
        from ray import serve

        app = serve.status().applications.get(self.app_name)
        if app is None:
            return {"status": "NOT_DEPLOYED"}
        deployment = app.deployments.get(self.replica_deployment)
        if deployment is None:
            return {"status": str(app.status)}
        states = {str(getattr(k, "value", k)): v for k, v in (deployment.replica_states or {}).items()}
        return {"status": str(getattr(deployment.status, "value", deployment.status)), "replica_states": states}

    async def _fresh_reports(self) -> None:
        """Re-read the reports unless they are fresh (concurrent requests share one read)."""
        if time.monotonic() - self._read_at < _FRESH_S:
            return
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._refresh(slow=False))
        try:
            await asyncio.wait_for(asyncio.shield(self._reading), _FRESH_WAIT_S)
        except TimeoutError:
            pass

    def current_reports(self) -> dict[str, dict[str, Any]]:
        """The reports with `age_s` counted to now (they keep ageing while the registry cannot be read)."""
        lag = time.monotonic() - self._read_at
        return {rid: {**rep, "age_s": rep.get("age_s", 0.0) + lag} for rid, rep in self.reports.items()}

    async def _refresh_loop(self) -> None:
        count = 0
        while True:
            await asyncio.sleep(self._interval_s)
            count += 1
            await self._refresh(slow=count % _SLOW_EVERY == 0)

    def health(self, probe: str = "health") -> tuple[http.HTTPStatus, dict]:
        reports = self.current_reports()
        states = replica_states(reports, self.stale_s)
        healthy = [reports[r] for r, s in states.items() if s == "healthy"]
        free = sum(max(0, r["capacity"] - r["sessions"]) for r in healthy)
        replicas = [{"replica": rid, "state": states[rid], "sessions": rep.get("sessions"),
                     "capacity": rep.get("capacity"), "age_s": round(rep.get("age_s", 0.0), 2),
                     "actor_name": rep.get("actor_name"), "engine": rep.get("health", {}).get("engine"),
                     "processes": rep.get("health", {}).get("frontend_processes", 1)}
                    for rid, rep in sorted(reports.items())]
        if probe == "live":
            ok = any(s != "down" for s in states.values())
            payload = {"status": "ok" if ok else "dead", "replicas": replicas}
        elif probe == "ready":
            ok = free > 0
            payload = {"status": "ready" if ok else "not_ready",
                       "reason": None if ok else ("no healthy replica" if not healthy else "every replica is full"),
                       "free_sessions": free}
        else:
            ok = bool(healthy)
            status = "unavailable" if not ok else "ok" if len(healthy) == len(states) else "degraded"
            payload = {"status": status, "replicas": replicas, "healthy_replicas": len(healthy),
                       "sessions": sum(r["sessions"] for r in healthy),
                       "capacity": sum(r["capacity"] for r in healthy), "free_sessions": free,
                       "serve": self.serve_view}
        return (http.HTTPStatus.OK if ok else http.HTTPStatus.SERVICE_UNAVAILABLE), payload

    def models(self) -> dict:
        for report in self.reports.values():
            if report.get("models"):
                return report["models"]
        return {"object": "list", "data": []}
