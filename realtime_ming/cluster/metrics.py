"""The cluster's /metrics: every replica's series (label `replica`) plus cluster totals.

Replicas report their own Prometheus exposition (server/metrics.py). The front renders, per family,
the replica series with a `replica` label (same names as a single server, so `sum without
(replica)` gives the total) and, under `realtime_ming_cluster_*`, the sums across the replicas now
reporting (counters, gauges and histogram buckets add up), plus the replica states and capacity.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["render_cluster_metrics", "sum_expositions"]

_PREFIX = "realtime_ming_"
_CLUSTER = "realtime_ming_cluster_"


def _cluster_name(name: str) -> str:
    return _CLUSTER + name[len(_PREFIX):] if name.startswith(_PREFIX) else _CLUSTER + name


class _Snapshot:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


class _Sums:
    """Families seen in several expositions, the samples of one name and labels added up (counters, gauges and
    histogram buckets of one process or replica each), `_created` samples left out."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}
        self._values: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))

    def add(self, family: Metric) -> None:
        self._families.setdefault(family.name, family)
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                self._values[family.name][(sample.name, tuple(sorted(sample.labels.items())))] += sample.value

    def metrics(self, rename=lambda name: name, documented: str = "") -> list[Metric]:
        out = []
        for name, family in self._families.items():
            metric = Metric(rename(name), family.documentation + documented, family.type)
            for (sample_name, labels), value in self._values[name].items():
                metric.add_sample(rename(sample_name), dict(labels), value)
            out.append(metric)
        return out


def _render(metrics: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(metrics))
    return generate_latest(registry)


def sum_expositions(texts: list[str]) -> str:
    """One exposition of several processes' (a replica's front ends), under the same names, the samples added up."""
    sums = _Sums()
    for text in texts:
        for family in text_string_to_metric_families(text):
            sums.add(family)
    return _render(sums.metrics()).decode()


def render_cluster_metrics(replicas: list[dict[str, Any]], states: dict[str, str]) -> bytes:
    """Exposition of `replicas` (reports with `replica` and `metrics` text) and their `states`
    (replica id -> healthy / draining / down)."""
    per: dict[str, Metric] = {}
    total = _Sums()
    for report in replicas:
        if states.get(report["replica"]) == "down":
            continue  # a dead replica's last numbers are not current
        for family in text_string_to_metric_families(report.get("metrics") or ""):
            mine = per.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            for sample in family.samples:
                mine.add_sample(sample.name, {**sample.labels, "replica": report["replica"]}, sample.value)
            total.add(family)
    replicas_metric = Metric(_CLUSTER + "replicas", "Replicas by state (healthy, draining, down).", "gauge")
    counts = {"healthy": 0, "draining": 0, "down": 0}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    for state, n in counts.items():
        replicas_metric.add_sample(_CLUSTER + "replicas", {"state": state}, n)
    capacity = Metric(_CLUSTER + "capacity", "Sessions the healthy replicas can hold.", "gauge")
    capacity.add_sample(_CLUSTER + "capacity", {}, sum(r.get("capacity", 0) for r in replicas
                                                       if states.get(r["replica"]) == "healthy"))
    return _render([*per.values(), *total.metrics(_cluster_name, " (all replicas)"), replicas_metric, capacity])
