"""Where replicas report and the front reads: a named Ray actor holding each replica's last report.

A replica reports every `report_interval_s` (health, sessions, capacity, rendered metrics) and
says goodbye when it stops; the front (`/health`, `/metrics`) reads the table and calls a replica
that has not reported for `replica_stale_s` down (it died, or its node did). One registry per Serve
application, detached so a restarted front or replica finds it again.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["registry_actor", "registry_name"]

NAMESPACE = "realtime-ming"


def registry_name(app_name: str) -> str:
    return f"{app_name}-registry"


class Registry:
    """Replica reports, by replica id (runs as a Ray actor; plain Python, so it is testable alone)."""

    def __init__(self) -> None:
        self._reports: dict[str, tuple[float, dict[str, Any]]] = {}

    def report(self, replica_id: str, report: dict[str, Any]) -> None:
        self._reports[replica_id] = (time.monotonic(), report)

    def forget(self, replica_id: str) -> None:
        self._reports.pop(replica_id, None)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every report with its age in seconds (`age_s`)."""
        now = time.monotonic()
        return {rid: {**report, "age_s": now - at} for rid, (at, report) in self._reports.items()}

    def prune(self, older_than_s: float) -> None:
        now = time.monotonic()
        for rid in [rid for rid, (at, _) in self._reports.items() if now - at > older_than_s]:
            del self._reports[rid]


def registry_actor(app_name: str):
    """The registry actor of `app_name` (created on first use; detached, no CPU)."""
    import ray

    actor = ray.remote(num_cpus=0, max_restarts=-1)(Registry)
    return actor.options(name=registry_name(app_name), namespace=NAMESPACE, lifetime="detached",
                         get_if_exists=True).remote()
