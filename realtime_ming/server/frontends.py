"""`server.frontend_processes` >= 2: the WebSockets in N front-end processes, the engine alone in this one.

One process serving both caps a GPU server at the CPU of one interpreter: every real-time spoken session
costs its process ~22-37 ms of GIL per second (frame parsing, JSON, the session runner, VAD), so ~30-45
sessions saturate it and the engine thread, under the same GIL, starves. `run_frontends(cfg)` (the CLI's
`realtime-ming serve` with the field set) checks, binds and loads exactly as one process does
(`run.run_server`), then:

- hosts the engine for the front ends (`engine_host.EngineHost`, a unix socket with a random auth key);
- starts N front ends (multiprocessing "spawn", server/frontend_process.py), each the same `RealtimeServer`
  with a `RemoteEngine` and the engine host's session tickets (`server.limits.max_sessions` is the whole
  server's). The parent serves no WebSocket: it accepts on the listening socket and hands each connection
  to the ready front end with the fewest open connections (`handoff.Dispatcher`; a burst spreads evenly,
  where N processes racing in accept() gave one of them most of it). The serving line is printed once every
  front end listens; a front end that fails to start ends the start with its reason (exit 2);
- supervises. SIGINT / SIGTERM: each front end gets one SIGTERM and drains as a single server does
  (a second signal closes at once), then the engine stops; exit 0. The engine dies: every front end sees it
  (503, open responses `failed` with `engine_unavailable`, sessions closed 1011) and exits, and so does
  this process, with `EXIT_ENGINE_DIED` (70). A front end dies: its sessions are lost (their clients
  reconnect, as do those handed to it and not yet adopted), the engine host ends its turns and frees its
  conversations and session tickets, no connection goes to it until it is restarted and ready; more than `_MAX_RESTARTS` deaths within `_RESTART_WINDOW_S` (a crash loop)
  stop the server with exit 70 instead.

Each front end has its own `/metrics` (the sessions, turns and errors of the process that answered the
scrape) and `/health` (the engine's health, the whole server's sessions, and `frontend`: its index, pid
and own sessions). Front ends run in their own process group: a terminal's Ctrl-C reaches this process
only, which forwards one SIGTERM; a front end whose parent is killed loses the engine and exits.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import os
import queue
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from ..engine.hooks import EngineHooks
from .loading import ServingEngine
from .run import EXIT_ENGINE_DIED, run_server
from .config import ServerConfig
from .engine_host import EngineHost
from .frontend_process import frontend_main
from .handoff import Dispatcher
from .startup import StartupError

__all__ = ["FrontEnds", "new_engine_host", "run_frontends", "serve_frontends"]

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 180.0  # a front end imports torch, loads the VAD / turn models, binds: seconds, not minutes
_MAX_RESTARTS = 5
_RESTART_WINDOW_S = 60.0
_POLL_S = 0.1


def run_frontends(cfg: ServerConfig, hooks: EngineHooks | None = None) -> int:
    """CLI entry for `server.frontend_processes` >= 2: `run.run_server` with the front ends serving."""
    return run_server(cfg, serve=serve_frontends, hooks=hooks)


def serve_frontends(cfg: ServerConfig, engine: ServingEngine, sock: socket.socket) -> int:
    """Host `engine`, serve `sock` from `cfg.server.frontend_processes` front ends until the end; exit code."""
    host, folder = new_engine_host(cfg, engine)
    host.start()
    try:
        return FrontEnds(cfg, sock, host).run()
    finally:
        host.close()
        shutil.rmtree(folder, ignore_errors=True)


def new_engine_host(cfg: ServerConfig, engine: ServingEngine) -> tuple[EngineHost, str]:
    """The engine host of `cfg`'s front ends, on a unix socket with a random auth key in a new private folder
    (returned: remove it once the host is closed)."""
    folder = tempfile.mkdtemp(prefix="realtime-ming-")
    host = EngineHost(engine, os.path.join(folder, "engine.sock"), secrets.token_bytes(32), cfg.server.voices,
                      cfg.server.limits.max_sessions, cfg.server.client_secrets,
                      voice_owners=len(cfg.server.auth.api_keys))
    return host, folder


class FrontEnds:
    """Starts, watches, restarts and stops the front-end processes (this process's main thread)."""

    def __init__(self, cfg: ServerConfig, sock: socket.socket, host: EngineHost,
                 gate: Callable[..., Any] | None = None) -> None:
        """`gate`: what each front end admits requests through (`frontend_process.frontend_main`'s), picklable."""
        self.cfg, self.sock, self.host, self.gate = cfg, sock, host, gate
        self.n = cfg.server.frontend_processes
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: list = [None] * self.n
        self.status: list[Connection | None] = [None] * self.n
        self.deaths: collections.deque[float] = collections.deque()
        self.signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.dispatcher = Dispatcher(sock, self.n)

    def run(self) -> int:
        """Start, print the serving line, supervise until the end; the exit code."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, _frame: self.signals.put(signum))
        try:
            self.start()
        except BaseException:
            self.dispatcher.close()
            raise
        host, port = self.sock.getsockname()[:2]
        scheme = "wss" if self.cfg.server.tls.enabled else "ws"
        host = f"[{host}]" if ":" in host else host
        print(f"realtime-ming: {self.n} front-end processes; serving {self.model_id()} on "
              f"{scheme}://{host}:{port}/v1/realtime", file=sys.stderr, flush=True)
        return self.supervise()

    def supervise(self) -> int:
        """After `start`: hand out connections, restart dead front ends, until the end (blocks); the exit code.
        `request_stop` (any thread) drains as SIGTERM does; a second one closes the sessions at once."""
        try:
            return self._supervise()
        finally:
            self.dispatcher.close()

    def request_stop(self) -> None:
        self.signals.put(signal.SIGTERM)

    def model_id(self) -> str:
        return self.cfg.server.model_id or str(self.host.engine.info().get("model") or "")

    # ---- start -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start every front end and wait until each listens (StartupError: one could not; none is left)."""
        try:
            for i in range(self.n):
                self._start(i)
            self._wait_started()
        except BaseException:
            self._stop(signal.SIGKILL, wait_s=5.0)
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None]

    def stop(self, wait_s: float = 30.0) -> list[int | None]:
        """SIGTERM (drain) every front end and wait for them; their exit codes."""
        return self._stop(signal.SIGTERM, wait_s)

    def _start(self, i: int) -> None:
        status, child_status = self.ctx.Pipe(duplex=False)
        channel = self.dispatcher.new_channel(i)
        level = logging.getLogger().getEffectiveLevel()
        proc = self.ctx.Process(target=frontend_main, name=f"realtime-ming-frontend-{i}", daemon=False,
                                args=(self.cfg, i, self.sock, channel, self.host.address, self.host.authkey,
                                      child_status, level, self.gate))
        proc.start()
        child_status.close()
        channel.close()  # the front end has its own copy: the channel ends when it does
        self.procs[i], self.status[i] = proc, status

    def _wait_started(self) -> None:
        """Until every front end listens; StartupError with the first one's reason that cannot."""
        waiting = set(range(self.n))
        deadline = time.monotonic() + _START_TIMEOUT_S
        while waiting:
            if not self.signals.empty():
                raise KeyboardInterrupt
            for i in sorted(waiting):
                message = self._status_of(i)
                if message is None and not self.procs[i].is_alive():
                    message = ("failed", f"exited with code {self.procs[i].exitcode} while starting")
                if message is None:
                    continue
                if message[0] != "ready":
                    raise StartupError(f"front-end process {i} did not start: {message[1]}")
                waiting.discard(i)
                self.dispatcher.mark_ready(i)
            if time.monotonic() > deadline:
                raise StartupError(f"front-end process(es) {sorted(waiting)} not listening after "
                                   f"{_START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        log.info("%d front-end processes listening (pids %s)", self.n, [p.pid for p in self.procs])

    def _status_of(self, i: int) -> tuple | None:
        conn = self.status[i]
        try:
            if conn is not None and conn.poll():
                return conn.recv()
        except (EOFError, OSError):
            self.status[i] = None
        return None

    # ---- serve -------------------------------------------------------------------------------------------
    def _wait(self, timeout_s: float) -> int | None:
        """Hand out connections for up to `timeout_s`; a signal that arrived meanwhile, or None."""
        try:
            return self.signals.get_nowait()
        except queue.Empty:
            pass
        self.dispatcher.run_for(timeout_s)
        try:
            return self.signals.get_nowait()
        except queue.Empty:
            return None

    def _supervise(self) -> int:
        while True:
            signum = self._wait(_POLL_S)
            if signum is not None:
                return self._shut_down(signal.Signals(signum))
            health = self.host.status().health
            if not health.alive:
                return self._engine_died(health.reason or "engine is not running")
            for i, proc in enumerate(self.procs):
                message = self._status_of(i)
                if message is not None and message[0] == "ready":
                    self.dispatcher.mark_ready(i)
                    log.info("front-end process %d (pid %s) is serving again", i, proc.pid)
                elif message is not None:
                    log.error("front-end process %d could not restart: %s", i, message[1])
                if not proc.is_alive() and not self._restart(i, proc.exitcode):
                    return EXIT_ENGINE_DIED

    def _restart(self, i: int, code: int | None) -> bool:
        """Front end `i` died: start it again (True), or False in a crash loop (then everything is stopped)."""
        self.dispatcher.drop(i)  # nothing more goes to it; what it had not adopted is closed
        now = time.monotonic()
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > _RESTART_WINDOW_S:
            self.deaths.popleft()
        if len(self.deaths) > _MAX_RESTARTS:
            log.critical("front-end process %d exited with code %s: %d front-end deaths within %.0f s; stopping the "
                         "server (exit %d)", i, code, len(self.deaths), _RESTART_WINDOW_S, EXIT_ENGINE_DIED)
            print(f"realtime-ming: front-end processes keep dying; exiting with code {EXIT_ENGINE_DIED}",
                  file=sys.stderr, flush=True)
            self._stop(signal.SIGTERM, wait_s=self._drain_wait_s())
            return False
        log.error("front-end process %d (pid %s) exited with code %s; its sessions are lost; restarting it", i,
                  self.procs[i].pid, code)
        self._start(i)
        return True

    def _shut_down(self, signum: signal.Signals) -> int:
        log.info("%s: draining %d front-end processes (responses in progress get up to %.0f s; a second signal "
                 "stops at once)", signum.name, self.n, self.cfg.server.limits.drain_timeout_s)
        codes = self._stop(signal.SIGTERM, wait_s=self._drain_wait_s(), forward_signals=True)
        if any(code == EXIT_ENGINE_DIED for code in codes) or not self.host.status().health.alive:
            return EXIT_ENGINE_DIED
        if any(code != 0 for code in codes):
            log.warning("front-end exit codes at shutdown: %s", codes)
        log.info("front ends stopped; stopping the engine")
        return 0

    def _engine_died(self, reason: str) -> int:
        log.critical("engine dead (%s): the front ends fail their open responses with engine_unavailable; exiting "
                     "with code %d", reason, EXIT_ENGINE_DIED)
        print(f"realtime-ming: engine dead ({reason}); exiting with code {EXIT_ENGINE_DIED}", file=sys.stderr,
              flush=True)
        self._stop(None, wait_s=5.0 + self.cfg.server.limits.shutdown_timeout_s)  # they exit on their own
        return EXIT_ENGINE_DIED

    def _drain_wait_s(self) -> float:
        limits = self.cfg.server.limits
        return limits.drain_timeout_s + limits.shutdown_timeout_s + 5.0

    def _stop(self, signum: int | None, wait_s: float, forward_signals: bool = False) -> list[int | None]:
        """Send `signum` to every live front end, wait up to `wait_s` for all (a signal of ours meanwhile is
        forwarded when `forward_signals`), kill what is left; their exit codes."""
        procs = [p for p in self.procs if p is not None]
        for proc in procs:
            if signum is not None and proc.is_alive():
                os.kill(proc.pid, signum)
        deadline = time.monotonic() + wait_s
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            again = self._wait(_POLL_S)  # a draining front end answers new connections (1013, /health 503)
            if again is None:
                continue
            if forward_signals:
                log.warning("%s again: closing the sessions now", signal.Signals(again).name)
                for proc in procs:
                    if proc.is_alive():
                        os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            if proc.is_alive():
                log.error("front-end process pid %d did not stop within %.0f s; killing it", proc.pid, wait_s)
                proc.kill()
            proc.join(5.0)
        return [p.exitcode for p in procs]
