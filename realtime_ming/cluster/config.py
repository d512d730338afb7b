"""The cluster config of `realtime-ming serve-cluster` (YAML): replicas, resources, autoscaling, HTTP.

Each replica loads the same `realtime-ming serve` config (`server_config` plus `overrides`), so a
session behaves exactly as on one server. A replica's capacity is min(`server.limits.max_sessions`,
`engine.thinker.max_slots`): it is the Serve `max_ongoing_requests` of the replica deployment (one
WebSocket = one ongoing request for its whole life), so Serve never routes a session to a full
replica. Loading is light (no ray, no torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["AutoscalingConfig", "ClusterConfig", "ClusterConfigError", "load_cluster_config"]


class ClusterConfigError(ValueError):
    """A cluster config that cannot be served (the message names the key)."""


@dataclass(frozen=True, slots=True)
class AutoscalingConfig:
    """Serve autoscaling on open sessions per replica.

    A replica aims at `target_fraction` of its capacity, so new capacity starts while the others
    still have room: replica start-up (model load, graph capture) takes time, and at
    the target there are (1 - target_fraction) x capacity sessions of headroom per replica to cover it.
    Sessions are long: scale down slowly (`downscale_delay_s`) and a scaled-down replica drains.
    """

    min_replicas: int = 1
    initial_replicas: int | None = None
    max_replicas: int = 4
    target_fraction: float = 0.75
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ClusterConfigError("autoscaling: need 0 <= min_replicas <= max_replicas and max_replicas >= 1")
        if self.initial_replicas is not None and not self.min_replicas <= self.initial_replicas <= self.max_replicas:
            raise ClusterConfigError("autoscaling.initial_replicas must lie within [min_replicas, max_replicas]")
        if not 0 < self.target_fraction <= 1:
            raise ClusterConfigError("autoscaling.target_fraction must be in (0, 1]")

    def serve_config(self, capacity: int) -> dict[str, Any]:
        """Serve's `autoscaling_config` for replicas of `capacity` sessions."""
        return {
            "min_replicas": self.min_replicas,
            "initial_replicas": self.initial_replicas if self.initial_replicas is not None else max(1, self.min_replicas),
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": max(1.0, self.target_fraction * capacity),
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
        }


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    server_config: str | None = None  # `realtime-ming serve` config every replica loads (None: the tiny demo)
    overrides: tuple[str, ...] = ()  # `--set` style overrides applied on top, on every replica
    replicas: int = 1  # fixed number of replicas (when `autoscaling` is unset)
    autoscaling: AutoscalingConfig | None = None
    num_cpus: float = 1.0  # Ray resources of one replica (ray_actor_options)
    num_gpus: float = 0.0
    host: str = "127.0.0.1"  # the Serve HTTP proxy
    port: int = 8000
    admission_wait_s: float = 1.0  # a new session waits this long for a free replica, then gets 1013
    report_interval_s: float = 0.5  # replica -> registry reports (health, sessions, metrics)
    replica_stale_s: float = 5.0  # a replica not heard from for this long is reported down
    graceful_shutdown_timeout_s: float | None = None  # None: server.limits.drain_timeout_s + 15 s
    health_check_period_s: float = 2.0
    health_check_timeout_s: float = 10.0
    app_name: str = "realtime-ming"

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ClusterConfigError("replicas must be >= 1")
        if self.admission_wait_s <= 0 or self.report_interval_s <= 0 or self.replica_stale_s <= self.report_interval_s:
            raise ClusterConfigError("admission_wait_s, report_interval_s > 0 and replica_stale_s > report_interval_s")


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ClusterConfigError(f"{where or 'the cluster config'} must be a mapping")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ClusterConfigError(f"unknown key(s) {', '.join(f'{where}{k}' for k in unknown)}")
    values = dict(data)
    if cls is ClusterConfig:
        if values.get("autoscaling") is not None:
            values["autoscaling"] = _build(AutoscalingConfig, values["autoscaling"], "autoscaling.")
        values["overrides"] = tuple(values.get("overrides") or ())
    try:
        return cls(**values)
    except TypeError as exc:
        raise ClusterConfigError(str(exc)) from exc


def load_cluster_config(path: str | Path | None = None, **changes: Any) -> ClusterConfig:
    """The cluster config of YAML file `path` (None: defaults), with `changes` (unset = None) applied."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ClusterConfigError(f"{path}: {exc}") from exc
    data.update({k: v for k, v in changes.items() if v is not None})
    return _build(ClusterConfig, data, "")
