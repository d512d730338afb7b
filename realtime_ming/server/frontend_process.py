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
from multiprocessing.connection import Connection

from .._exit import exit_now
from .run import serve_until_signal
from .config import ServerConfig
from .handoff import HandoffLoop
from .remote_engine import RemoteEngine
from .startup import StartupError

__all__ = ["frontend_main"]

log = logging.getLogger(__name__)

_LOG_FORMAT = "%(asctime)s %(levelname)s {name} %(name)s: %(message)s"


def frontend_main(cfg: ServerConfig, index: int, sock: socket.socket, channel: socket.socket, address: str,
                  authkey: bytes, status: Connection, level: int) -> None:
    """A front-end process: `RealtimeServer` adopting the connections of `channel`, the engine over `address`.
    `sock` is the server's listening socket: it names the port; this process accepts nothing on it."""
    os.setpgrp()  # a terminal's Ctrl-C goes to the parent, which forwards one SIGTERM (one drain, not a hard stop)
    logging.basicConfig(level=level, format=_LOG_FORMAT.format(name=f"frontend-{index}"))
    code = 2
    engine = None
    try:
        engine = RemoteEngine.connect(address, authkey, name=f"frontend-{index}")
        with asyncio.Runner(loop_factory=HandoffLoop) as runner:
            code = runner.run(serve_until_signal(
                cfg, engine, sock, ready=lambda _server: _tell(status, ("ready", os.getpid())),
                tickets=engine.session_tickets(), frontend=index, handoff=channel))
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


def _tell(status: Connection, message: tuple) -> None:
    try:
        status.send(message)
    except (OSError, ValueError):
        pass  # the parent is gone
