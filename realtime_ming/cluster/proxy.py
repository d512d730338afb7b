"""ASGI middleware for Ray Serve's HTTP proxy: the cluster's `/v1/realtime` answers like a single server.

* Admission: Serve queues a request while every replica is at `max_ongoing_requests` (= its session
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
processes (`REALTIME_MING_ADMISSION_WAIT_S` sets the wait): `realtime-ming serve-cluster` sets it
for a Ray instance it starts; a cluster started with `ray start` or KubeRay sets it on every node.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import os

from websockets.frames import CloseCode

from ..protocol.codec import serialise
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.server_events import Error
from ..server.asgi import asgi_request
from ..server.handshake import inspect_handshake, select_subprotocol
from ..server.http import REALTIME_PATH, request_path

__all__ = ["FULL_REASON", "LOST_REASON", "VOICES_PATH", "VOICES_UNSUPPORTED", "RealtimeProxyMiddleware", "is_voices_path",
           "middlewares", "voice_routes_refusal"]

log = logging.getLogger(__name__)

FULL_REASON = "server at its session limit; try again later"  # the single server's words (server/app.py)
LOST_REASON = "replica lost; reconnect"
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


class RealtimeProxyMiddleware:
    def __init__(self, app, admission_wait_s: float = 1.0) -> None:
        self.app = app
        self.admission_wait_s = admission_wait_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and is_voices_path(asgi_request(scope).path):
            await voice_routes_refusal(scope, send)  # answered here: no replica slot, even when all are full
            return
        if scope["type"] != "websocket" or request_path(asgi_request(scope).path) != REALTIME_PATH:
            await self.app(scope, receive, send)
            return
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
            offered = tuple(scope.get("subprotocols") or ())
            await send({"type": "websocket.accept", "subprotocol": select_subprotocol(offered)})
            await send({"type": "websocket.close", "code": int(CloseCode.TRY_AGAIN_LATER), "reason": FULL_REASON})
            return
        try:
            await task
        except Exception as exc:
            log.warning("realtime session's replica request failed: %s", exc)
        if state["closed"]:
            return
        if not state["accepted"]:  # the replica failed before accepting (e.g. it died while starting)
            await send({"type": "websocket.accept", "subprotocol": select_subprotocol(tuple(scope.get("subprotocols") or ()))})
            await send({"type": "websocket.close", "code": int(CloseCode.TRY_AGAIN_LATER), "reason": FULL_REASON})
            return
        dialect = inspect_handshake(asgi_request(scope)).dialect
        frame = serialise(Error.from_protocol_error(ProtocolError(ErrorCode.REPLICA_LOST)), dialect)
        with contextlib.suppress(Exception):
            if frame is not None:
                await send({"type": "websocket.send", "text": frame})
            await send({"type": "websocket.close", "code": int(CloseCode.SERVICE_RESTART), "reason": LOST_REASON})


def middlewares(admission_wait_s: float | None = None) -> list:
    """The proxy middleware list (Starlette `Middleware` entries): the proxy callback's return value."""
    from starlette.middleware import Middleware

    if admission_wait_s is None:
        admission_wait_s = float(os.environ.get("REALTIME_MING_ADMISSION_WAIT_S", "1.0"))
    return [Middleware(RealtimeProxyMiddleware, admission_wait_s=admission_wait_s)]
