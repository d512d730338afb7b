"""Engine supervision helpers: bounded fault logging, the tensor-parallel worker watch, fault injection.

`FaultLog` logs an unexpected exception with its traceback the first time a (place, class) pair is
seen and as one line afterwards, so a repeated fault cannot flood the log.

`WorkerWatch` waits on the process sentinels of the tensor-parallel workers in its own thread (no
polling on the engine thread, no collective, no device sync): a worker that exits while the engine
runs is reported at once through `on_death(reason)`.

Fault injection (tests and drills only) is off unless the environment variable
`REALTIME_MING_FAULT_INJECTION=1` is set when the engine starts: then a turn whose system text or any
text content contains `KILL_ENGINE_MARKER` kills the engine thread at admission (as a bug or a dead
device would), so supervisors, health probes and restarts can be exercised end to end. Never set it
in production.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from .api import ContentKind, TurnRequest

__all__ = [
    "FAULT_INJECTION_ENV",
    "KILL_ENGINE_MARKER",
    "FaultLog",
    "InjectedEngineDeath",
    "WorkerWatch",
    "asks_for_engine_death",
    "dead_workers",
    "fault_injection_enabled",
]

FAULT_INJECTION_ENV = "REALTIME_MING_FAULT_INJECTION"
KILL_ENGINE_MARKER = "[[realtime-ming:kill-engine]]"


class InjectedEngineDeath(BaseException):
    """Raised on the engine thread by the fault injection (a BaseException: nothing on the way catches it)."""


def fault_injection_enabled() -> bool:
    return os.environ.get(FAULT_INJECTION_ENV, "").strip() == "1"


def asks_for_engine_death(request: TurnRequest) -> bool:
    """Whether `request` carries the kill marker (checked only while fault injection is enabled)."""
    if request.system is not None and KILL_ENGINE_MARKER in request.system:
        return True
    return any(c.kind is ContentKind.TEXT and KILL_ENGINE_MARKER in (c.text or "")
               for message in request.history for c in message.content)


class FaultLog:
    """Logs each unexpected exception: a traceback once per (place, exception class), then one line."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._seen: set[tuple[str, type]] = set()

    def report(self, place: str, exc: BaseException) -> None:
        key = (place, type(exc))
        first = key not in self._seen
        self._seen.add(key)
        self._log.error("%s failed: %s: %s%s", place, type(exc).__name__, exc,
                        "" if first else " (traceback logged before)", exc_info=exc if first else None)


class WorkerWatch:
    """Reports the first exit of a tensor-parallel worker process while the engine runs."""

    def __init__(self, procs: list, on_death: Callable[[str], None], poll_s: float = 0.25) -> None:
        self._procs = list(procs)
        self._on_death = on_death
        self._poll_s = poll_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="realtime-ming-tp-watch", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, thinker: object, on_death: Callable[[str], None]) -> WorkerWatch | None:
        """A watch over `thinker.procs` (the tensor-parallel proxy's workers); None without workers."""
        procs = getattr(thinker, "procs", None)
        return cls(procs, on_death) if procs else None

    def stop(self) -> None:
        """Stop watching (before the workers are stopped on purpose); idempotent."""
        self._stopping.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self._poll_s + 1.0)

    def _run(self) -> None:
        from multiprocessing.connection import wait

        sentinels = {p.sentinel: p for p in self._procs}
        while not self._stopping.is_set():
            exited = wait(list(sentinels), timeout=self._poll_s)  # blocks on the processes' handles
            if exited and not self._stopping.is_set():
                dead = [sentinels[s] for s in exited]
                for p in dead:
                    p.join(timeout=0.1)  # reap it so `exitcode` is known
                self._on_death("; ".join(f"tensor-parallel worker {p.name} (pid {p.pid}) exited with code "
                                         f"{p.exitcode}" for p in dead))
                return


def dead_workers(thinker: object, wait_s: float = 0.5) -> str | None:
    """After a failed step: the tensor-parallel workers that are gone, if any. A peer's death reaches
    rank 0 as a collective error (e.g. gloo's connection reset) a moment before its process is reaped,
    so this looks for up to `wait_s`; without workers it answers at once."""
    gone = getattr(thinker, "dead_workers", None)
    if gone is None:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        dead = gone()
        if dead:
            return "tensor-parallel workers gone: " + ", ".join(dead)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
