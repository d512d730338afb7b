"""The realtime-ming server: one port, WebSocket `/v1/realtime` plus plain HTTP, on uvloop.

`RealtimeServer(cfg, engine)` serves an already-loaded engine (tests, embedding);
`run_server(cfg)` is the CLI path: load the engine with a progress bar, log the effective
config, serve until SIGINT/SIGTERM, then shut down in order (stop accepting → close sessions
with 1001 → wait for handlers, bounded → stop the engine).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from ..audio.vad import VadBackend, VadKind, create_silero_session, create_vad
from ..engine.api import EngineHandle
from ..protocol.session import DEFAULT_MODEL, DEFAULT_VOICE
from .config import ServerConfig, config_to_dict
from .connection import ConnectionContext, serve_connection
from .handshake import check_access, inspect_handshake, select_subprotocol
from .http import HttpRoutes, default_web_roots, text_response
from .metrics import ServerMetrics

__all__ = ["TINY_MODEL_NOTICE", "RealtimeServer", "ServingEngine", "load_engine", "run_server"]

log = logging.getLogger(__name__)

TINY_MODEL_NOTICE = (
    "No model path given: serving the embedded tiny model with random weights. Its output is "
    "random-weight noise, not meaningful speech or text. Pass --model-path to serve Ming-flash-omni-2.0."
)


class ServingEngine(EngineHandle, Protocol):
    """An `EngineHandle` that also describes itself (realtime_ming.engine.Engine)."""

    def info(self) -> dict: ...

    def voices(self) -> list[str]: ...


class RealtimeServer:
    """Serves `engine` as configured by `cfg`; use `async with` or `start()` / `close()`.

    The engine's lifetime belongs to the caller (`close()` does not stop it).
    """

    def __init__(self, cfg: ServerConfig, engine: ServingEngine) -> None:
        self.cfg = cfg
        self.engine = engine
        self.metrics = ServerMetrics()
        self._info = dict(engine.info())
        self.model_id = cfg.server.model_id or str(self._info.get("model") or DEFAULT_MODEL)
        voices = tuple(engine.voices())
        self.default_voice = _default_voice(cfg, voices)
        self._num_sessions = 0
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
        self._ctx = ConnectionContext(
            engine=engine,
            settings=cfg.session,
            limits=cfg.server.limits,
            metrics=self.metrics,
            model_id=self.model_id,
            voices=voices or (self.default_voice,),
            default_voice=self.default_voice,
            make_vad=self._make_vad,
            media_info=self._info.get("media"),
        )

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

    def _make_vad(self, backend: str) -> VadBackend:
        if backend == VadKind.SILERO.value and self._silero is None:
            self._silero = create_silero_session()  # one ONNX session shared by all detectors
        return create_vad(VadKind(backend), silero_session=self._silero)

    async def start(self) -> None:
        """Bind and start accepting (returns at once)."""
        limits = self.cfg.server.limits
        if self.cfg.session.vad.backend == VadKind.SILERO.value:
            self._silero = await asyncio.to_thread(create_silero_session)
        self._server = await serve(
            self._handle,
            self.cfg.server.host,
            self.cfg.server.port,
            process_request=self._process_request,
            select_subprotocol=lambda _conn, offered: select_subprotocol(offered),
            compression=None,  # base64 audio barely compresses; deflate would only add latency
            max_size=limits.max_message_bytes,
            max_queue=limits.max_inbound_frames,
            open_timeout=limits.open_timeout_s,
        )
        log.info("listening on http://%s:%d (WebSocket /v1/realtime)", self.cfg.server.host, self.port)

    async def close(self) -> None:
        """Stop accepting, close open sessions with 1001 and wait for them (bounded). Idempotent."""
        if self._server is None:
            return
        self._server.close(close_connections=True)
        try:
            async with asyncio.timeout(self.cfg.server.limits.shutdown_timeout_s):
                await self._server.wait_closed()
        except TimeoutError:
            log.warning("sessions still open after %.1f s; leaving them", self.cfg.server.limits.shutdown_timeout_s)

    async def __aenter__(self) -> RealtimeServer:  # noqa: PYI034 (final class)
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        response = await self.routes.respond(request)
        if response is not None:
            return response
        refusal = check_access(inspect_handshake(request), self.cfg.server.auth)
        if refusal is not None:
            self.metrics.refusals.labels(refusal.reason).inc()
            return text_response(refusal.status, refusal.message)
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        info = inspect_handshake(ws.request)
        if self._num_sessions >= self.cfg.server.limits.max_sessions:
            self.metrics.refusals.labels("max_sessions").inc()
            await ws.close(CloseCode.TRY_AGAIN_LATER, "server at its session limit; try again later")
            return
        # Counted before the first await so concurrent handshakes cannot overshoot the limit.
        self._num_sessions += 1
        self._idle.clear()
        self.metrics.sessions.inc()
        self.metrics.sessions_accepted.inc()
        try:
            await serve_connection(ws, self._ctx, info)
        finally:
            self._num_sessions -= 1
            self.metrics.sessions.dec()
            if self._num_sessions == 0:
                self._idle.set()

    def _health(self) -> dict:
        return {
            "status": "ok",
            "model": self.model_id,
            "device": self._info.get("device"),
            "sessions": self._num_sessions,
            "max_sessions": self.cfg.server.limits.max_sessions,
        }

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


def _redacted(cfg: ServerConfig) -> dict:
    data = config_to_dict(cfg)
    keys = data["server"]["auth"]["api_keys"]
    data["server"]["auth"]["api_keys"] = [f"<{len(keys)} key(s)>"] if keys else []
    return data


def _progress_callback() -> tuple[Callable[[str, int, int], None], Callable[[], None]]:
    """A tqdm bar per loading step (on stderr) and a function that closes the last one."""
    from tqdm import tqdm

    bars: dict[str, Any] = {}

    def progress(label: str, done: int, total: int) -> None:
        bar = bars.get(label)
        if bar is None:
            for other in bars.values():
                other.close()
            bar = bars[label] = tqdm(total=total, desc=label, file=sys.stderr, leave=True)
        bar.total = total
        bar.n = done
        bar.refresh()

    def close() -> None:
        for bar in bars.values():
            bar.close()

    return progress, close


def load_engine(cfg: ServerConfig) -> ServingEngine:
    """Load the model with a progress bar (blocking; call off the event loop)."""
    from ..engine import Engine

    progress, finish = _progress_callback()
    started = time.monotonic()
    try:
        engine = Engine.create(cfg.engine, progress=progress)
    finally:
        finish()
    log.info("engine ready in %.1f s: %s", time.monotonic() - started, json.dumps(engine.info(), default=str))
    return engine


async def _serve_until_signal(cfg: ServerConfig, engine: ServingEngine) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with RealtimeServer(cfg, engine) as server:
        print(f"realtime-ming: serving {server.model_id} on ws://{cfg.server.host}:{server.port}/v1/realtime",
              file=sys.stderr, flush=True)
        await stop.wait()
        log.info("shutting down")


def run_server(cfg: ServerConfig) -> int:
    """CLI entry: load, serve until a signal, shut down. Returns the exit code."""
    log.info("effective config: %s", json.dumps(_redacted(cfg)))
    if cfg.engine.model_path is None and cfg.engine.weights == "checkpoint":
        print(f"realtime-ming: {TINY_MODEL_NOTICE}", file=sys.stderr, flush=True)
    engine = load_engine(cfg)
    try:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve_until_signal(cfg, engine))
    finally:
        engine.close()
    return 0

