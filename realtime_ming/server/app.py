"""The realtime-ming server: one port, WebSocket `/v1/realtime` plus plain HTTP, on uvloop.

`RealtimeServer(cfg, engine)` serves an already-loaded engine (tests, embedding, each front-end process);
`run.run_server(cfg)` is the CLI path around it (bind, load, serve until a signal, exit codes). With `server.tls`
the one port serves `wss://` and `https://`. The server drains (`begin_drain`: new sessions get 1013, new responses
are refused, responses in progress finish) and closes its sessions (`close`, `end_sessions`); an engine death
fails the open responses with `engine_unavailable` (`wait_engine_failure`).

WebRTC calls (`POST /v1/realtime/calls`, server/call_routes.py) and ephemeral keys (`POST
/v1/realtime/client_secrets`, server/secret_routes.py) share the port; a call is one more session, admitted,
counted, drained and closed like a WebSocket one.

Health: `/health` is 503 while the engine is dead or the server drains; `/health/live` is 503
only when the engine is dead (restart me); `/health/ready` is 503 unless a new session would be
served now (engine alive, not draining, below `max_sessions`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
import inspect
import logging
import os
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from ..audio.commands import shared_command_spotter
from ..audio.end_of_turn import shared_smart_turn
from ..audio.vad import VadBackend, VadKind, create_silero_session, create_vad
from ..engine.api import engine_health, engine_prompt_meter
from ..protocol.session import DEFAULT_MODEL, DEFAULT_VOICE
from .call_routes import CallRoutes
from .client_secrets import ClientSecrets, Grant, SecretStore, authorize
from .config import ServerConfig, resolve_api_keys
from .connection import ConnectionContext, LiveSessions, MediaPath, preview_session, serve_connection
from .big_frames import frame_connection_factory
from .frame_parser import big_frame_limits, limits_parser
from .handoff import Adopter, HandoffLoop
from .handshake import (
    HandshakeInfo,
    inspect_handshake,
    select_subprotocol,
    sideband_refusal,
)
from .http import HttpRoutes, default_web_roots, request_path, text_response
from .http_body import BodyConnection
from .lifecycle import TurnTracker
from .loading import ServingEngine
from .metrics import ServerMetrics
from .remote_engine import SessionTickets
from .secret_routes import SecretRoutes
from .startup import check_exposure, open_listener, ssl_context
from .transport import Transport, WebsocketsTransport
from .voice_routes import VoiceRoutes

__all__ = ["FRONTEND_HEADER", "RealtimeServer"]

log = logging.getLogger(__name__)

FRONTEND_HEADER = "x-realtime-ming-frontend"  # with server.frontend_processes >= 2: the answering process's index
_ENGINE_POLL_S = 0.1  # how often the serving loop looks at the engine's health (a field read, no engine call)
_FLUSH_S = 0.2  # after the last turn ended: time for sessions to hand their final events to the sockets


class _AccessLog(logging.LoggerAdapter):
    """websockets' logger with its per-request INFO lines (HTTP response sent, connection open/closed,
    server listening/closing) moved to DEBUG: a /health poll does not fill the log."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        super().log(logging.DEBUG if level == logging.INFO else level, msg, *args, **kwargs)


class RealtimeServer:
    """Serves `engine` as configured by `cfg`; use `async with` or `start()` / `close()`.

    The engine's lifetime belongs to the caller (`close()` does not stop it). `sock` is an already
    bound, listening socket to serve on (`startup.open_listener`); None = bind `server.host:port`.
    A non-loopback host without API keys refuses to start unless `server.auth.allow_unauthenticated`.
    `admit` (a `websockets` process_request hook, plain or async) answers every request first and refuses
    what it returns a response for; a server started with one skips that exposure check, the hook deciding
    who may connect (a cluster replica's one-time lease tokens, realtime_ming/cluster/lease.py).
    """

    def __init__(self, cfg: ServerConfig, engine: ServingEngine, *, sock: socket.socket | None = None,
                 admit: Callable[[ServerConnection, Request], Response | None | Awaitable[Response | None]]
                 | None = None,
                 tickets: SessionTickets | None = None, frontend: int | None = None,
                 handoff: socket.socket | None = None) -> None:
        self.cfg = cfg = resolve_api_keys(cfg)
        self.engine = engine
        self._sock = sock
        self._admit = admit
        self._tickets = tickets  # max_sessions across the front-end processes (server/frontends.py); None: this one
        self._frontend = frontend  # this front end's index, shown in /health
        self._handoff = handoff  # a front end's channel of handed-over connections (server/handoff.py); `sock` then
        self._adopter: Adopter | None = None  # only names the port, nothing is accepted on it here
        self.metrics = ServerMetrics()
        self._info = dict(engine.info())
        self.model_id = cfg.server.model_id or str(self._info.get("model") or DEFAULT_MODEL)
        voices = tuple(engine.voices())
        self.default_voice = _default_voice(cfg, voices)
        self._num_sessions = 0
        self._draining = False  # set by `begin_drain` / `close`: no new session, no new response
        self._closed = False
        self._turns = TurnTracker(engine)  # the sessions' engine: counts turns in flight, refuses new ones when draining
        self._live = LiveSessions()  # the open sessions: the shutdown ends their responses before closing them
        self._idle = asyncio.Event()  # set while no session is open
        self._idle.set()
        self._started_at = int(time.time())
        self._server: Server | None = None
        self._silero: Any = None
        self.routes = HttpRoutes(
            metrics=self.metrics,
            health=self._health,
            models=self._models,
            web_roots=default_web_roots(cfg.server.web_dir),
        )
        encoder = getattr(engine, "voice_encoder", None)
        store = getattr(engine, "voice_store", None)  # the engine process's store (a remote engine)
        self.voice_routes = VoiceRoutes(cfg.server.voices, cfg.server.auth, encoder if callable(encoder) else lambda: None,
                                        store() if callable(store) else None)
        self._ctx = ConnectionContext(
            engine=self._turns,
            settings=cfg.session,
            limits=cfg.server.limits,
            metrics=self.metrics,
            model_id=self.model_id,
            voices=voices or (self.default_voice,),
            default_voice=self.default_voice,
            make_vad=self._make_vad,
            media_info=self._info.get("media"),
            voice_lookup=self.voice_routes.lookup_for,
            mcp_allowed_hosts=cfg.server.mcp.allowed_hosts,
            mcp_timeout_s=cfg.server.mcp.timeout_s,
            mcp_max_response_bytes=cfg.server.mcp.max_response_bytes,
            live=self._live,
            prompt_meter=engine_prompt_meter(engine),
        )
        shared = getattr(engine, "client_secrets", None)  # the engine process's store (a front end)
        self.secrets: SecretStore = shared() if callable(shared) else ClientSecrets(cfg.server.client_secrets)
        self.secret_routes = SecretRoutes(cfg.server.client_secrets, cfg.server.auth, self.secrets, self._preview)
        self.call_routes = CallRoutes(cfg, self.secrets, serve=self.serve_session, preview=self._preview,
                                      refusal=self._refusal)
        # who each accepted upgrade authenticated as (dies with its connection, even one whose handshake then fails)
        self._grants: weakref.WeakKeyDictionary[ServerConnection, Grant] = weakref.WeakKeyDictionary()

    @property
    def num_sessions(self) -> int:
        """Open realtime sessions."""
        return self._num_sessions

    async def wait_idle(self) -> None:
        """Return once no session is open (cancel-safe)."""
        await self._idle.wait()

    @property
    def port(self) -> int:
        """The bound TCP port (useful with port 0)."""
        if self._server is None:
            raise RuntimeError("server not started")
        return self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        """`ws://host:port/v1/realtime` (`wss://` with TLS) of the started server."""
        host = self.cfg.server.host or "0.0.0.0"
        host = f"[{host}]" if ":" in host else host
        scheme = "wss" if self.cfg.server.tls.enabled else "ws"
        return f"{scheme}://{host}:{self.port}/v1/realtime"

    def _make_vad(self, backend: str) -> VadBackend:
        if backend == VadKind.SILERO.value and self._silero is None:
            self._silero = create_silero_session()  # one ONNX session shared by all detectors
        return create_vad(VadKind(backend), silero_session=self._silero)

    async def start(self) -> None:
        """Bind (unless given a socket) and start accepting (returns at once). Raises StartupError."""
        limits = self.cfg.server.limits
        if self._admit is None:
            check_exposure(self.cfg)
        tls = ssl_context(self.cfg.server.tls)
        await self.prepare()
        sock = self._sock or open_listener(self.cfg.server.host, self.cfg.server.port)
        extra: dict[str, Any] = {} if self._frontend is None else {"process_response": self._name_frontend}
        loop = asyncio.get_running_loop()
        if self._handoff is not None:  # connections arrive over the channel, not through accept()
            if not isinstance(loop, HandoffLoop):
                raise RuntimeError("a server with `handoff` runs on a handoff.HandoffLoop")
            loop.adopt_on(sock)
        self._server = await serve(
            self._handle,
            sock=sock,
            ssl=tls,
            logger=_AccessLog(logging.getLogger("websockets.server")),
            process_request=self._process_request,
            select_subprotocol=lambda _conn, offered: select_subprotocol(offered),
            compression=None,  # base64 audio barely compresses; deflate would only add latency
            max_size=limits.max_message_bytes,
            max_queue=limits.max_inbound_frames,
            open_timeout=limits.open_timeout_s,
            create_connection=frame_connection_factory(self.cfg.server.voices.max_upload_bytes,
                                                       big_frame_limits(limits)),
            **extra,
        )
        if self._handoff is not None:
            factory = loop.protocol_factory_for(sock)
            self._adopter = Adopter(self._handoff, factory, tls, limits.open_timeout_s)
        log.info("listening on %s (HTTP on the same port)", self.url)

    async def prepare(self) -> None:
        """Load what sessions share (the Silero VAD session, semantic_vad's model, the stop-command reader, the
        frame-parser process) off the loop; `start` calls it, a transport that serves `serve_session` itself
        (server/asgi.py) calls it once."""
        await asyncio.to_thread(limits_parser(self.cfg.server.limits).start)
        if self.cfg.session.vad.backend == VadKind.SILERO.value and self._silero is None:
            self._silero = await asyncio.to_thread(create_silero_session)
        await asyncio.to_thread(shared_smart_turn)  # semantic_vad's model, loaded off the loop (~1-2 s)
        if self.cfg.session.vad.detector.barge_in_commands:
            await asyncio.to_thread(shared_command_spotter)  # the stop-command reader (~0.2-1 s)

    @property
    def draining(self) -> bool:
        """True once shutdown began: new sessions are refused (1013), new responses fail."""
        return self._draining

    def engine_failure(self) -> str | None:
        """Why the engine is dead, or None while it serves."""
        health = engine_health(self.engine)
        return None if health.alive else (health.reason or "engine is not running")

    async def wait_engine_failure(self) -> str:
        """Return the reason once the engine is dead (cancel-safe)."""
        while (reason := self.engine_failure()) is None:
            await asyncio.sleep(_ENGINE_POLL_S)
        return reason

    def begin_drain(self) -> None:
        """Graceful shutdown, step 1: refuse new sessions (1013, /health/ready 503) and new responses
        (`server_shutting_down`); responses in progress run on."""
        if not self._draining:
            log.info("draining: %d response(s) in progress, %d session(s) open", self._turns.in_flight(),
                     self._num_sessions)
        self._draining = True
        self._turns.drain()

    async def wait_responses_done(self, timeout_s: float) -> bool:
        """Graceful shutdown, step 2: wait until no response is in progress (False: `timeout_s` passed first),
        then give the sessions a moment to send their last events."""
        done = await self._turns.wait_idle(timeout_s)
        await asyncio.sleep(_FLUSH_S)
        return done

    async def drain(self, timeout_s: float) -> bool:
        """`begin_drain`, `wait_responses_done(timeout_s)`, then `close()` (1001). True when nothing was cut off."""
        self.begin_drain()
        done = await self.wait_responses_done(timeout_s)
        if not done:
            log.warning("drain: %d response(s) still in progress after %.1f s; closing anyway",
                        self._turns.in_flight(), timeout_s)
        await self.close()
        return done

    async def close(self, code: CloseCode = CloseCode.GOING_AWAY, reason: str = "server shutting down") -> None:
        """Stop accepting, close open sessions with `code` and wait for them (bounded). Idempotent."""
        if self._server is None or self._closed:
            return
        self._closed = self._draining = True
        self._turns.drain()
        server = self._server
        server.close(close_connections=False)  # stop accepting; the sessions are closed below with `code`
        if self._adopter is not None:
            self._adopter.close()  # and adopting handed-over connections
        timeout_s = self.cfg.server.limits.shutdown_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                await self.end_sessions(code, reason, timeout_s)  # response.done of each running response, then close
                await asyncio.gather(*(ws.close(code, reason) for ws in server.connections), return_exceptions=True)
                await server.wait_closed()
        except TimeoutError:
            log.warning("sessions still open after %.1f s; leaving them", timeout_s)
        await self.call_routes.close(timeout_s)
        self.voice_routes.close()

    async def end_sessions(self, code: CloseCode, reason: str, timeout_s: float) -> None:
        """Every open session ends its running responses (`response.done`: cancelled, `server_shutting_down`) and
        closes with `code` after them; returns when they all closed or `timeout_s` passed."""
        if not len(self._live):
            return
        deadline = asyncio.get_running_loop().time() + timeout_s
        await self._live.end_all(code, reason, timeout_s)
        try:
            async with asyncio.timeout_at(deadline):
                await self._idle.wait()
        except TimeoutError:
            log.warning("%d session(s) still open %.1f s after their close was queued", self._num_sessions, timeout_s)

    async def __aenter__(self) -> RealtimeServer:  # noqa: PYI034 (final class)
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if self._admit is not None:
            refusal = self._admit(connection, request)
            if inspect.isawaitable(refusal):
                refusal = await refusal
            if refusal is not None:
                return refusal
        path = request_path(request.path)
        if VoiceRoutes.matches(path):
            return await self.voice_routes.respond(connection, request)
        if SecretRoutes.matches(path):
            return await self.secret_routes.respond(connection, request)
        if CallRoutes.matches(path):
            return await self.call_routes.respond(connection, request)
        if isinstance(connection, BodyConnection):
            request.method = connection.http_method  # websockets < 17 is shown GET for every method
        response = await self.routes.respond(request)
        if response is not None:
            return response
        grant = sideband_refusal(request) or await authorize(inspect_handshake(request), self.cfg.server.auth,
                                                             self.secrets, redeem=True)
        if not isinstance(grant, Grant):
            self.metrics.refusals.labels(grant.reason).inc()
            return text_response(grant.status, grant.message)
        self._grants[connection] = grant
        return None

    def _name_frontend(self, _connection: ServerConnection, _request: Request, response: Response) -> None:
        """Every response of a front-end process names it (`FRONTEND_HEADER`: its index)."""
        response.headers[FRONTEND_HEADER] = str(self._frontend)

    async def _handle(self, ws: ServerConnection) -> None:
        grant = self._grants.pop(ws, None)
        info = inspect_handshake(ws.request)
        if grant is None:  # not reached: every accepted upgrade went through _process_request
            await ws.close(CloseCode.POLICY_VIOLATION, "not authorized")
            return
        await self.serve_session(WebsocketsTransport(ws), dataclasses.replace(info, api_key=grant.api_key),
                                 initial=() if grant.session is None else (grant.session,))

    async def _preview(self, configs: Sequence[Mapping[str, Any]], info: HandshakeInfo) -> dict:
        """The session object `configs` give a session of `info`'s key (raises connection.InitialConfigError)."""
        return await asyncio.to_thread(preview_session, self._ctx, info, configs)

    def _refusal(self) -> tuple[str, str] | None:
        """Why a new session would be refused now (code, message), or None."""
        if self._draining:
            return "server_shutting_down", "The server is shutting down; try again later."
        if self._num_sessions >= self.cfg.server.limits.max_sessions:
            return "session_limit_reached", "The server is at its session limit; try again later."
        return None

    async def serve_session(self, ws: Transport, info: HandshakeInfo, *, initial: Sequence[Mapping[str, Any]] = (),
                            media: MediaPath | None = None) -> None:
        """Admit (or refuse with 1013) and run one accepted realtime connection (`/v1/realtime`, a call) to its end."""
        if self._draining:
            self.metrics.refusals.labels("draining").inc()
            await ws.close(CloseCode.TRY_AGAIN_LATER, "server is shutting down; try again later")
            return
        if self._num_sessions >= self.cfg.server.limits.max_sessions:
            self.metrics.refusals.labels("max_sessions").inc()
            await ws.close(CloseCode.TRY_AGAIN_LATER, "server at its session limit; try again later")
            return
        # Counted before the first await so concurrent handshakes cannot overshoot the limit.
        self._num_sessions += 1
        self._idle.clear()
        if self._tickets is not None and not await self._tickets.acquire():  # the limit of every front end
            self._session_ended()
            self.metrics.refusals.labels("max_sessions").inc()
            await ws.close(CloseCode.TRY_AGAIN_LATER, "server at its session limit; try again later")
            return
        self.metrics.sessions.inc()
        self.metrics.sessions_accepted.inc()
        try:
            await serve_connection(ws, self._ctx, info, initial=initial, media=media)
        finally:
            if self._tickets is not None:
                self._tickets.release()
            self.metrics.sessions.dec()
            self._session_ended()

    def _session_ended(self) -> None:
        self._num_sessions -= 1
        if self._num_sessions == 0:
            self._idle.set()

    @property
    def total_sessions(self) -> int:
        """Sessions open on the whole server (every front end's, with `tickets`)."""
        return self._num_sessions if self._tickets is None else self._tickets.total()

    def _health(self, probe: str = "health") -> tuple[http.HTTPStatus, dict]:
        """`/health` (overall), `/health/live` (process and engine alive) or `/health/ready` (a new session
        would be served now): 200 or 503, with the reason."""
        failure = self.engine_failure()
        engine = {"alive": failure is None, "reason": failure}
        limit = self.cfg.server.limits.max_sessions
        sessions = self.total_sessions
        if probe == "live":
            ok = failure is None
            payload = {"status": "ok" if ok else "dead", "engine": engine}
        elif probe == "ready":
            reason = ("engine unavailable" if failure is not None else "draining" if self._draining
                      else "at max_sessions" if sessions >= limit else None)
            ok = reason is None
            payload = {"status": "ready" if ok else "not_ready", "reason": reason, "sessions": sessions,
                       "max_sessions": limit, "engine": engine}
        else:
            ok = failure is None and not self._draining
            payload = {
                "status": "ok" if ok else "unavailable" if failure is not None else "draining",
                "model": self.model_id,
                "device": self._info.get("device"),
                "sessions": sessions,
                "max_sessions": limit,
                "draining": self._draining,
                "engine": engine,
            }
        if self._frontend is not None:  # which front-end process answered, and its own sessions
            payload["frontend"] = {"index": self._frontend, "pid": os.getpid(), "sessions": self._num_sessions}
        return (http.HTTPStatus.OK if ok else http.HTTPStatus.SERVICE_UNAVAILABLE), payload

    def _models(self) -> dict:
        entry = {"id": self.model_id, "object": "model", "created": self._started_at, "owned_by": "realtime-ming"}
        entry.update({k: v for k, v in self._info.items() if k in ("device", "dtype", "voices", "is_tiny_default")})
        return {"object": "list", "data": [entry]}


def _default_voice(cfg: ServerConfig, voices: tuple[str, ...]) -> str:
    """The voice new sessions start with; raises ValueError when the configured one is unknown."""
    for wanted in (cfg.session.voice, cfg.engine.default_voice):
        if wanted is not None:
            if voices and wanted not in voices:
                raise ValueError(f"voice {wanted!r} is not one of the checkpoint's voices {voices}")
            return wanted
    if not voices or DEFAULT_VOICE in voices:
        return DEFAULT_VOICE
    return voices[0]
