"""Prometheus metrics of one server instance (its own CollectorRegistry, rendered at /metrics).

Sessions, turns by status, TTFA (commit → first audio delta), per-stage engine timings, errors
by code and refused connections by reason. Everything is updated on the event loop.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "ServerMetrics"]

# Seconds: fine resolution below one second, where the latency targets live.
_LATENCY_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class ServerMetrics:
    """The metric families; `render()` is the /metrics body."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.sessions = Gauge("realtime_ming_sessions", "Open realtime sessions.", registry=r)
        self.sessions_accepted = Counter("realtime_ming_sessions_accepted", "Sessions accepted.", registry=r)
        self.turns = Counter(
            "realtime_ming_turns", "Responses finished, by final status.", ["status"], registry=r
        )
        self.ttfa = Histogram(
            "realtime_ming_ttfa_seconds",
            "Time from end of user input (commit / speech stop / response.create) to the first audio delta.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "realtime_ming_stage_seconds",
            "Engine stage timestamps relative to the turn's submission.",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.errors = Counter("realtime_ming_errors", "Error events sent, by code.", ["code"], registry=r)
        self.refusals = Counter(
            "realtime_ming_refusals", "Connections refused, by reason.", ["reason"], registry=r
        )
        self.speculative = Counter(
            "realtime_ming_speculative_turns",
            "Speculative turns, by outcome (confirmed / discarded).",
            ["outcome"],
            registry=r,
        )

    def render(self) -> bytes:
        """Prometheus text exposition of this server's registry."""
        return generate_latest(self.registry)
