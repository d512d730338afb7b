"""The server process's life (`realtime-ming serve`): check the config against this machine and bind the port
(`startup`), log a short summary of the config (the whole of it at DEBUG: `config_report`), load the engine,
serve until SIGINT/SIGTERM, shut down.

On SIGINT/SIGTERM the server drains (refuses new sessions with 1013 and new responses, lets responses in progress
finish within `server.limits.drain_timeout_s`, then ends those still running with a `response.done` (`cancelled`,
error `server_shutting_down`) and closes sessions with 1001 after it; a second signal skips the wait), stops the
engine and exits 0. If the engine dies (its thread, or a tensor-parallel worker), the open responses end `failed`
with `engine_unavailable`, sessions close with 1011 and the process exits with `EXIT_ENGINE_DIED` (70) so a
supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

from websockets.frames import CloseCode

from ..engine.hooks import EngineHooks
from .app import RealtimeServer
from .config import ServerConfig
from .config_report import config_yaml, summary
from .loading import ServingEngine, load_engine
from .startup import StartupError, load_failure, open_listener, prepare

__all__ = ["EXIT_ENGINE_DIED", "TINY_MODEL_NOTICE", "run_server", "serve_until_signal"]

log = logging.getLogger(__name__)

EXIT_ENGINE_DIED = 70  # EX_SOFTWARE: the engine died while serving; a supervisor should restart the process

TINY_MODEL_NOTICE = (
    "No model path given: serving the embedded tiny model with random weights. Its output is "
    "random-weight noise, not meaningful speech or text. Pass --model-path to serve Ming-flash-omni-2.0."
)


async def _first(*aws) -> asyncio.Future:
    """Wait until the first of `aws` finishes; cancel the others; return the finished one."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
    return next(t for t in tasks if t in done)


async def serve_until_signal(cfg: ServerConfig, engine: ServingEngine, sock: socket.socket | None = None, *,
                             ready: Callable[[RealtimeServer], None] | None = None, **server_args: Any) -> int:
    """Serve until a signal (drain, exit 0) or the engine's death (exit `EXIT_ENGINE_DIED`). Once listening,
    print the serving line (or call `ready(server)`: a front-end process tells its parent)."""
    signals: asyncio.Queue[signal.Signals] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    async with RealtimeServer(cfg, engine, sock=sock, **server_args) as server:
        if ready is None:
            print(f"realtime-ming: serving {server.model_id} on {server.url}", file=sys.stderr, flush=True)
        else:
            ready(server)
        dead = server.wait_engine_failure()
        first = await _first(signals.get(), dead)
        if isinstance(first.result(), signal.Signals):
            drain_s = cfg.server.limits.drain_timeout_s
            log.info("%s: draining (responses in progress get up to %.0f s; a second signal stops at once)",
                     first.result().name, drain_s)
            server.begin_drain()
            first = await _first(server.wait_responses_done(drain_s), signals.get(), server.wait_engine_failure())
            outcome = first.result()
            if isinstance(outcome, signal.Signals):
                log.warning("%s again: closing the sessions now", outcome.name)
            elif outcome is False:
                log.warning("drain: responses still in progress after %.0f s; closing anyway", drain_s)
        reason = server.engine_failure()
        if reason is not None:
            log.critical("engine dead (%s): open responses failed with engine_unavailable; exiting with code %d",
                         reason, EXIT_ENGINE_DIED)
            print(f"realtime-ming: engine dead ({reason}); exiting with code {EXIT_ENGINE_DIED}", file=sys.stderr,
                  flush=True)
            server.begin_drain()
            await server.wait_responses_done(1.0)  # the engine already failed them: let response.done go out
            await server.close(CloseCode.INTERNAL_ERROR, "model engine unavailable")
            return EXIT_ENGINE_DIED
        log.info("shutting down")
        await server.close()
    return 0


def _serve_here(cfg: ServerConfig, engine: ServingEngine, sock: socket.socket) -> int:
    """Serve the WebSockets in this process, on uvloop (`server.frontend_processes` = 1)."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve_until_signal(cfg, engine, sock))


def run_server(cfg: ServerConfig,
               serve: Callable[[ServerConfig, ServingEngine, socket.socket], int] = _serve_here,
               hooks: EngineHooks | None = None) -> int:
    """CLI entry: check, bind, load, serve until a signal, shut down. Returns the exit code.

    `serve(cfg, engine, sock)` serves the loaded engine on the bound socket until the end (default: in this
    process; `frontends.run_frontends` passes its front-end processes'). `hooks`: the engine's test and
    benchmark substitutions (`serve --hook`; `engine/hooks.py`).
    Raises StartupError (one line) for a config this machine cannot serve, a port it cannot bind,
    or a model that fails to load for a known reason — all before the port accepts a connection.
    """
    cfg = prepare(cfg)
    sock = open_listener(cfg.server.host, cfg.server.port)
    try:
        log.info("realtime-ming serve\n%s", summary(cfg, sock.getsockname()[1]))
        if log.isEnabledFor(logging.DEBUG):  # the whole config only on request (or `serve --print-config`)
            log.debug("effective config:\n%s", config_yaml(cfg))
        if cfg.engine.model_path is None and cfg.engine.weights == "checkpoint":
            print(f"realtime-ming: {TINY_MODEL_NOTICE}", file=sys.stderr, flush=True)
        try:
            engine = load_engine(cfg, hooks)
        except Exception as exc:
            message = load_failure(exc)
            if message is None:
                raise
            raise StartupError(message) from exc
    except BaseException:
        sock.close()
        raise
    try:
        code = serve(cfg, engine, sock)
    finally:
        engine.close()
    log.info("engine closed; exit code %d", code)
    return code

