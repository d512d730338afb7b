"""One front-end process of `server.frontend_processes` >= 2 (started by server/frontends.py, "spawn").

It serves the WebSockets with the same `RealtimeServer` as one process, on a `RemoteEngine` (the engine
process's engine over a unix socket) and the engine host's session tickets; its connections come handed
over by the engine process (server/handoff.py) on `channel`. This module is what a spawned front end
imports first: it must not import what only the engine process needs (engine_host, the model).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .._exit import exit_now
from .run import EXIT_ENGINE_DIED, serve_until_signal
from .config import ServerConfig
from .handoff import HandoffLoop
from .remote_engine import RemoteEngine
from .startup import StartupError

__all__ = ["frontend_main"]

log = logging.getLogger(__name__)

_LOG_FORMAT = "%(asctime)s %(levelname)s {name} %(name)s: %(message)s"


def frontend_main(cfg: ServerConfig, index: int, sock: socket.socket, channel: socket.socket, address: str,
                  authkey: bytes, status: Connection, level: int, gate: Callable[..., Any] | None = None) -> None:
    """A front-end process: `RealtimeServer` adopting the connections of `channel`, the engine over `address`.
    `sock` is the server's listening socket: it names the port; this process accepts nothing on it.

    `gate` (a cluster replica's front ends, cluster/lease.py `FrontendGate`): called with (engine, index), it
    gives the `admit` hook every request passes first and `serving(server)`, called once listening. With a
    gate, a lost connection to the engine host (the replica's actor is gone) ends this process at once, its
    connections dropped without a close frame, so the cluster's proxy tells each client `replica_lost`."""
    os.setpgrp()  # a terminal's Ctrl-C goes to the parent, which forwards one SIGTERM (one drain, not a hard stop)
    logging.basicConfig(level=level, format=_LOG_FORMAT.format(name=f"frontend-{index}"))
    code = 2
    engine = None
    try:
        engine = RemoteEngine.connect(address, authkey, name=f"frontend-{index}",
                                      on_lost=None if gate is None else _host_lost)
        admit = None if gate is None else gate(engine, index)

        def ready(server) -> None:
            if admit is not None:
                admit.serving(server)
            _tell(status, ("ready", os.getpid()))

        with asyncio.Runner(loop_factory=HandoffLoop) as runner:
            code = runner.run(serve_until_signal(
                cfg, engine, sock, ready=ready, tickets=engine.session_tickets(), frontend=index, handoff=channel,
                admit=None if admit is None else admit.process_request))
    except StartupError as exc:
        _tell(status, ("failed", str(exc)))
    except Exception as exc:
        log.exception("front end %d failed", index)
        _tell(status, ("failed", f"{type(exc).__name__}: {exc}"))
        code = 1
    finally:
        if engine is not None:
            engine.close()
    exit_now(code)  # finalization could abort a clean exit (onnxruntime, torch threads: see `exit_now`)


def _host_lost(reason: str) -> None:
    log.critical("engine host lost (%s): the replica is gone; exiting, its connections dropped", reason)
    os._exit(EXIT_ENGINE_DIED)


def _tell(status: Connection, message: tuple) -> None:
    try:
        status.send(message)
    except (OSError, ValueError):
        pass  # the parent is gone
