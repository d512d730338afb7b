"""ASGI middleware for Ray Serve's HTTP proxy: the cluster's `/v1/realtime` answers like a single server.

* Data path: a new session first takes a lease from the replica deployment (a Serve-routed streaming
  call, `RealtimeReplica.lease`, open for the session's life, so it counts against the replica's
  `max_ongoing_requests`). A replica on the `direct` data path grants its own port and a one-time
  token, and the session's frames are relayed over one TCP connection to that port (cluster/relay.py):
  Ray is off the per-frame path. A replica on the `serve` data path says so, and the session goes
  through Serve as an ASGI WebSocket request (every frame crossing Ray), as below.
* Admission: Serve queues a request (the lease call, or the WebSocket request) while every replica is at `max_ongoing_requests` (= its session
  capacity). A new session that no replica has accepted within `admission_wait_s` is withdrawn from
  that queue and refused exactly as a full single server refuses it: accepted, then closed with 1013
  "server at its session limit; try again later". A slot that frees within the wait is taken.
* Voice cloning: `/v1/realtime/voices` is refused with 501 `voice_cloning_unsupported` (JSON error).
  A replica keeps registered voices in its own memory, so a voice registered through one replica
  would be unknown to the sessions the others serve; the cluster refuses the routes instead of
  half-working (`voice_routes_refusal` also answers on a replica reached without this middleware).
* Replica loss: when the replica holding a session dies, Serve's proxy just ends the request; the
  middleware then sends an `error` event (`replica_lost`) and closes with 1012 (service restart:
  reconnect), instead of a dropped TCP connection (1006).

Ray Serve 2.60 installs proxy middlewares only through the environment variable
`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=realtime_ming.cluster.proxy:middlewares` of the proxy
processes (`REALTIME_MING_ADMISSION_WAIT_S` sets the wait, `REALTIME_MING_APP_NAME` the Serve
application of the replicas, default `realtime-ming`): `realtime-ming serve-cluster` sets it
for a Ray instance it starts; a cluster started with `ray start` or KubeRay sets it on every node.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from websockets.frames import CloseCode

from ..server.asgi import asgi_request
from ..server.handshake import select_subprotocol
from ..server.http import REALTIME_PATH, request_path
from .config import REPLICA_DEPLOYMENT
from .relay import LOST_REASON, close_replica_lost, relay_direct

__all__ = ["FULL_REASON", "LOST_REASON", "VOICES_PATH", "VOICES_UNSUPPORTED", "LeaseCall", "RealtimeProxyMiddleware",
           "is_voices_path", "middlewares", "voice_routes_refusal"]

log = logging.getLogger(__name__)

FULL_REASON = "server at its session limit; try again later"  # the single server's words (server/app.py)
DEFAULT_APP_NAME = "realtime-ming"
VOICES_PATH = REALTIME_PATH + "/voices"  # server/voice_routes.py's (not imported: it needs torch)
VOICES_UNSUPPORTED = "voice_cloning_unsupported"
_VOICES_MESSAGE = ("Voice cloning (/v1/realtime/voices) is not available on a Ray Serve cluster: each replica keeps "
                   "its registered voices in its own memory, so a voice registered through one replica would be "
                   "unknown to sessions on the others. Use a preset voice, or a single `realtime-ming serve` "
                   "server for cloned voices.")


def is_voices_path(path: str) -> bool:
    path = request_path(path)
    return path == VOICES_PATH or path.startswith(VOICES_PATH + "/")


async def voice_routes_refusal(scope, send) -> None:
    """Answer an HTTP request for `/v1/realtime/voices` (any method) with 501 and a JSON error."""
    body = json.dumps({"error": {"type": "invalid_request_error", "code": VOICES_UNSUPPORTED,
                                 "message": _VOICES_MESSAGE, "param": None}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": int(http.HTTPStatus.NOT_IMPLEMENTED), "headers": headers})
    await send({"type": "http.response.body", "body": body})


class LeaseCall(Protocol):
    """A streaming lease call (Serve's DeploymentResponseGenerator): the grant, then the end of the session."""

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]: ...

    async def __anext__(self) -> dict[str, Any]: ...

    def cancel(self) -> None: ...


async def _refuse_full(scope, send) -> None:
    """What a full single server answers: accepted, then 1013 with its reason."""
    await send({"type": "websocket.accept", "subprotocol": select_subprotocol(tuple(scope.get("subprotocols") or ()))})
    await send({"type": "websocket.close", "code": int(CloseCode.TRY_AGAIN_LATER), "reason": FULL_REASON})


def _replaying(first: dict, receive):
    """`receive` that hands out `first` (a message already read) once before the rest."""
    pending = [first]

    async def replay():
        return pending.pop() if pending else await receive()

    return replay


class RealtimeProxyMiddleware:
    """`leases` opens a lease call on the replica deployment (None: every session through Serve)."""

    def __init__(self, app, admission_wait_s: float = 1.0,
                 leases: Callable[[], Awaitable[LeaseCall]] | None = None, open_timeout_s: float = 10.0) -> None:
        self.app = app
        self.admission_wait_s = admission_wait_s
        self.leases = leases
        self.open_timeout_s = open_timeout_s
        self._lease_problem_logged = False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and is_voices_path(asgi_request(scope).path):
            await voice_routes_refusal(scope, send)  # answered here: no replica slot, even when all are full
            return
        if scope["type"] != "websocket" or request_path(asgi_request(scope).path) != REALTIME_PATH:
            await self.app(scope, receive, send)
            return
        if self.leases is None:
            await self._through_serve(scope, receive, send)
            return
        connect = await receive()
        if connect["type"] != "websocket.connect":
            return
        try:
            call = await self.leases()
        except Exception as exc:  # e.g. no such Serve application: the request routing still works
            if not self._lease_problem_logged:
                self._lease_problem_logged = True
                log.warning("no lease handle on the replica deployment (%s): sessions go through Serve "
                            "(set REALTIME_MING_APP_NAME to the replicas' Serve application)", exc)
            await self._through_serve(scope, _replaying(connect, receive), send)
            return
        try:
            async with asyncio.timeout(self.admission_wait_s):
                grant = await call.__anext__()
        except TimeoutError:  # no replica took the session: every one is full
            call.cancel()
            await _refuse_full(scope, send)
            return
        except Exception as exc:  # StopAsyncIteration too: the replica failed before granting (died while starting)
            log.warning("lease call failed before a grant: %r", exc)
            call.cancel()
            await _refuse_full(scope, send)
            return
        if grant.get("data_path") != "direct":  # the replicas run the serve data path
            await self._through_serve(scope, _replaying(connect, receive), send)
            return
        if not await relay_direct(scope, receive, send, grant, call, open_timeout_s=self.open_timeout_s):
            call.cancel()  # the session is over but the lease call is not: free the replica's Serve slot

    async def _through_serve(self, scope, receive, send) -> None:
        """The serve data path: the session is Serve's ASGI WebSocket request to a replica."""
        answered = asyncio.Event()
        state = {"accepted": False, "closed": False}

        async def watched_send(message) -> None:
            kind = message["type"]
            if kind == "websocket.accept":
                state["accepted"] = True
            elif kind == "websocket.close" or kind.startswith("websocket.http.response"):
                state["closed"] = True
            answered.set()
            await send(message)

        task = asyncio.create_task(self.app(scope, receive, watched_send))
        waiter = asyncio.create_task(answered.wait())
        try:
            await asyncio.wait({task, waiter}, timeout=self.admission_wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not answered.is_set() and not task.done():  # no replica took the session: every one is full
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await _refuse_full(scope, send)
            return
        try:
            await task
        except Exception as exc:
            log.warning("realtime session's replica request failed: %s", exc)
        if state["closed"]:
            return
        if not state["accepted"]:  # the replica failed before accepting (e.g. it died while starting)
            await _refuse_full(scope, send)
            return
        await close_replica_lost(scope, send)


class _ServeLeases:
    """Opens `RealtimeReplica.lease` calls through a Serve handle (made on first use, off the proxy's loop)."""

    def __init__(self, app_name: str) -> None:
        self.app_name = app_name
        self._handle: Any = None

    def _make_handle(self):
        from ray import serve

        return serve.get_deployment_handle(REPLICA_DEPLOYMENT, self.app_name).options(method_name="lease", stream=True)

    async def __call__(self) -> LeaseCall:
        if self._handle is None:
            self._handle = await asyncio.to_thread(self._make_handle)
        return self._handle.remote()


def middlewares(admission_wait_s: float | None = None, app_name: str | None = None) -> list:
    """The proxy middleware list (Starlette `Middleware` entries): the proxy callback's return value."""
    from starlette.middleware import Middleware

    if admission_wait_s is None:
        admission_wait_s = float(os.environ.get("REALTIME_MING_ADMISSION_WAIT_S", "1.0"))
    if app_name is None:
        app_name = os.environ.get("REALTIME_MING_APP_NAME", DEFAULT_APP_NAME)
    return [Middleware(RealtimeProxyMiddleware, admission_wait_s=admission_wait_s, leases=_ServeLeases(app_name))]
