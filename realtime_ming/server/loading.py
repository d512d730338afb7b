"""Loading the engine for the CLI: the model with a progress display (tqdm bars on a terminal, log lines
elsewhere), and what the server needs of an engine besides `EngineHandle` (`ServingEngine`)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Protocol

from ..engine.api import EngineHandle
from ..engine.hooks import EngineHooks
from .config import ServerConfig

__all__ = ["ServingEngine", "load_engine"]

log = logging.getLogger(__name__)


class ServingEngine(EngineHandle, Protocol):
    """An `EngineHandle` that also describes itself (realtime_ming.engine.Engine)."""

    def info(self) -> dict: ...

    def voices(self) -> list[str]: ...


class _LoadProgress:
    """The engine's `progress(label, done, total)` callback: on a terminal one tqdm bar per step, each
    completed when the next step starts (the engine reports a step's items as they begin); elsewhere
    (a log file) one INFO line as each step starts."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._label: str | None = None
        self._bar: Any = None

    def __call__(self, label: str, done: int, total: int) -> None:
        if label != self._label:
            self._end_step()
            from tqdm import tqdm

            self._label = label
            if self._tty:
                self._bar = tqdm(total=total, desc=label, file=sys.stderr, mininterval=0.25)
            else:
                log.info("loading %s: %d item(s)", label, total)
        if self._bar is not None:
            self._bar.total = total
            if done > self._bar.n:
                self._bar.update(done - self._bar.n)

    def _end_step(self) -> None:
        if self._label is None:
            return
        if self._bar is not None:
            self._bar.update(self._bar.total - self._bar.n)
            self._bar.close()
        self._label = self._bar = None

    def finish(self, completed: bool) -> None:
        """Complete the last step (`completed`) or just close its bar (the load failed)."""
        if completed:
            self._end_step()
        elif self._bar is not None:
            self._bar.close()


def load_engine(cfg: ServerConfig, hooks: EngineHooks | None = None) -> ServingEngine:
    """Load the model with a progress display (blocking; call off the event loop). `hooks`: test and
    benchmark substitutions (`serve --hook`), never from the config."""
    from ..engine import Engine

    progress = _LoadProgress()
    started = time.monotonic()
    completed = False
    try:
        engine = Engine.create(cfg.engine, progress=progress, hooks=hooks)
        completed = True
    finally:
        progress.finish(completed)
    info = engine.info()
    log.info("engine ready in %.1f s: %s, %d voice(s)", time.monotonic() - started, info.get("model"),
             len(info.get("voices") or ()))
    log.debug("engine info: %s", json.dumps(info, default=str))
    return engine
