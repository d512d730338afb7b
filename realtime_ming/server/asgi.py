"""The realtime server as an ASGI application: a second thin transport over the same `RealtimeServer`.

`RealtimeAsgiApp(server)` serves what the `websockets` server serves on its port — WebSocket
`/v1/realtime` and the plain-HTTP routes (/health, /v1/models, /metrics, the demo) — to any ASGI
server: Ray Serve's ingress (realtime_ming.cluster), uvicorn. Nothing is implemented twice: the
request is turned into a `websockets` Request so the same `HttpRoutes`, `inspect_handshake` and
`check_access` answer it, and an accepted socket becomes an `AsgiTransport` handed to
`RealtimeServer.serve_session` (same admission, same 1013 refusals, same session runner).

A refused upgrade (401/403) is answered with the ASGI WebSocket denial response when the server
offers that extension, else with a close before accepting (the ASGI server answers 403).
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from websockets.datastructures import Headers
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from .call_routes import CallRoutes
from .client_secrets import Grant, authorize
from .handshake import inspect_handshake, select_subprotocol, sideband_refusal
from .http import REALTIME_PATH, api_error, request_path, text_response
from .secret_routes import SecretRoutes
from .transport import TransportClosed

if TYPE_CHECKING:
    from .app import RealtimeServer

__all__ = ["AsgiTransport", "RealtimeAsgiApp", "asgi_request", "refuse_upgrade"]

log = logging.getLogger(__name__)

Scope = dict[str, Any]


def asgi_request(scope: Scope) -> Request:
    """The `websockets` Request of an ASGI http/websocket scope (path with query, headers, method)."""
    path = scope.get("path") or "/"
    root = scope.get("root_path") or ""
    if root and not path.startswith(root):  # ASGI servers that strip the mount point from `path`
        path = root.rstrip("/") + path
    query = scope.get("query_string") or b""
    target = path + ("?" + query.decode("latin-1") if query else "")
    headers = Headers()
    for name, value in scope.get("headers") or ():
        headers[name.decode("latin-1")] = value.decode("latin-1")
    method = scope.get("method", "GET") if scope["type"] == "http" else "GET"
    return Request(target, headers, method=method, protocol="HTTP/" + str(scope.get("http_version", "1.1")))


class AsgiTransport:
    """An accepted ASGI WebSocket as a `Transport` (see server/transport.py)."""

    def __init__(self, receive, send, max_message_bytes: int) -> None:
        self._receive, self._send = receive, send
        self._max_message_bytes = max_message_bytes
        self.closed = False

    async def recv(self) -> str | bytes:
        if self.closed:
            raise TransportClosed
        message = await self._receive()
        kind = message["type"]
        if kind == "websocket.receive":
            data = message.get("text")
            data = message.get("bytes") if data is None else data
            if data is None:
                data = ""
            if len(data) > self._max_message_bytes:  # what websockets' max_size does: close 1009
                await self.close(CloseCode.MESSAGE_TOO_BIG, f"message over {self._max_message_bytes} bytes")
                raise TransportClosed
            return data
        self.closed = True  # websocket.disconnect
        raise TransportClosed

    async def send(self, frame: str) -> None:
        if self.closed:
            raise TransportClosed
        try:
            await self._send({"type": "websocket.send", "text": frame})
        except (OSError, RuntimeError) as exc:  # the ASGI server reports a gone peer this way (uvicorn)
            self.closed = True
            raise TransportClosed from exc

    async def close(self, code: int, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self._send({"type": "websocket.close", "code": int(code), "reason": reason})
        except (OSError, RuntimeError):
            pass

    def abort(self) -> None:
        self.closed = True  # the ASGI server drops the socket once the application returns


async def _send_response(send, response: Response, *, websocket: bool) -> None:
    prefix = "websocket.http.response" if websocket else "http.response"
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.raw_items()]
    await send({"type": f"{prefix}.start", "status": response.status_code, "headers": headers})
    await send({"type": f"{prefix}.body", "body": bytes(response.body)})


async def refuse_upgrade(scope: Scope, send, response: Response) -> None:
    """Refuse an ASGI WebSocket upgrade with `response` (401, 403, ...) where the server offers the denial
    response extension, else with a close before accepting (the ASGI server then answers 403)."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await _send_response(send, response, websocket=True)
    else:
        await send({"type": "websocket.close", "code": int(CloseCode.POLICY_VIOLATION), "reason": ""})


class RealtimeAsgiApp:
    """ASGI callable over a `RealtimeServer` whose `start()` is never called (the ASGI server owns the port).

    The engine's lifetime stays with the caller. `lifespan` startup runs `server.prepare()`;
    `drain(timeout_s)` is the graceful stop of server/app.py for this transport. `accept_headers`
    (lower-case name, value) go on every accepted upgrade's response (a cluster replica names itself).
    """

    def __init__(self, server: RealtimeServer, accept_headers: Sequence[tuple[str, str]] = ()) -> None:
        self.server = server
        self._accept_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in accept_headers]
        self._open: set[AsgiTransport] = set()
        self._prepared = False

    @property
    def num_open(self) -> int:
        """Accepted WebSockets not finished yet."""
        return len(self._open)

    async def __call__(self, scope: Scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def ensure_prepared(self) -> None:
        if not self._prepared:
            await self.server.prepare()
            self._prepared = True

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.ensure_prepared()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, send) -> None:
        request = asgi_request(scope)
        path = request_path(request.path)
        if CallRoutes.matches(path) or SecretRoutes.matches(path):
            response = api_error(501, "not_served_here", f"{path} is served by `realtime-ming serve` (its own port), "
                                 "not through the ASGI transport: use the WebSocket here.")
            await _send_response(send, response, websocket=False)
            return
        response = await self.server.routes.respond(request)
        if response is None:  # GET /v1/realtime without the upgrade
            response = text_response(http.HTTPStatus.UPGRADE_REQUIRED,
                                     f"{REALTIME_PATH} is a WebSocket endpoint: connect with ws:// or wss://.\n")
            response.headers["Upgrade"] = "websocket"
        await _send_response(send, response, websocket=False)

    async def _websocket(self, scope: Scope, receive, send) -> None:
        server = self.server
        request = asgi_request(scope)
        connect = await receive()
        if connect["type"] != "websocket.connect":
            return
        if request_path(request.path) != REALTIME_PATH:
            response = await server.routes.respond(request)
            await refuse_upgrade(scope, send, response or text_response(http.HTTPStatus.NOT_FOUND, "Not found.\n"))
            return
        info = inspect_handshake(request)
        grant = sideband_refusal(request) or await authorize(info, server.cfg.server.auth, server.secrets, redeem=True)
        if not isinstance(grant, Grant):
            server.metrics.refusals.labels(grant.reason).inc()
            await refuse_upgrade(scope, send, text_response(grant.status, grant.message))
            return
        await self.ensure_prepared()
        await send({"type": "websocket.accept", "subprotocol": select_subprotocol(info.subprotocols),
                    "headers": self._accept_headers})
        transport = AsgiTransport(receive, send, server.cfg.server.limits.max_message_bytes)
        self._open.add(transport)
        try:
            await server.serve_session(transport, dataclasses.replace(info, api_key=grant.api_key),
                                       initial=() if grant.session is None else (grant.session,))
        finally:
            self._open.discard(transport)

    async def close_sessions(self, code: int = CloseCode.GOING_AWAY, reason: str = "server shutting down") -> None:
        """Close every open session with `code`, each after the `response.done` of its running responses (their
        handlers then end and free the engine turns)."""
        await self.server.end_sessions(CloseCode(code), reason, self.server.cfg.server.limits.shutdown_timeout_s)
        await asyncio.gather(*(t.close(code, reason) for t in list(self._open)), return_exceptions=True)

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new sessions and responses, let responses in progress finish (within `timeout_s`), then
        close the sessions with 1001. True when no response was cut off."""
        server = self.server
        server.begin_drain()
        done = await server.wait_responses_done(timeout_s)
        if not done:
            log.warning("drain: responses still in progress after %.1f s; closing anyway", timeout_s)
        await self.close_sessions()
        return done
