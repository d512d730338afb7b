"""The cluster config of `realtime-ming serve-cluster` (YAML): replicas, resources, autoscaling, HTTP.

Each replica loads the same `realtime-ming serve` config (`server_config` plus `overrides`), so a
session behaves exactly as on one server. A replica's capacity is min(`server.limits.max_sessions`,
`engine.thinker.max_slots`): it is the Serve `max_ongoing_requests` of the replica deployment (one
WebSocket = one ongoing request for its whole life), so Serve never routes a session to a full
replica. Loading is light (no ray, no torch).

`data_path` picks how a session's frames travel between Serve's proxy and its replica: `direct`
(default) - the replica serves the session on its own `websockets` port (`direct_host`, a port of
`direct_port_range`) and the proxy relays the client's frames to it over one TCP connection, so Ray is
off the per-frame path; `serve` - every frame crosses Ray between the proxy and the replica actor (for
networks where the proxies cannot reach the replicas' ports). Admission is Serve's in both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DATA_PATHS", "ONE_PROCESS_SESSIONS", "REPLICA_DEPLOYMENT", "AutoscalingConfig",
    "ClusterConfig", "ClusterConfigError", "check_replica_config", "load_cluster_config", "load_replica_config",
    "serving_processes",
]

DATA_PATHS = ("direct", "serve")
REPLICA_DEPLOYMENT = "RealtimeReplica"  # the Serve deployment of the replicas (the proxy's lease calls name it)
# Real-time spoken sessions one interpreter carries: each costs its process ~22-37 ms of GIL a second
# (server/frontends.py). On one H200, a replica serving them in its actor's process kept TTFA_server within the
# plain server's at 16, not at 32 (1.5 s p50), and 64 did not finish (bench/results/gpu-h200-ray-overhead-2026-11-29,
# gpu-h200x2-ray-replicas-2026-11-29).
ONE_PROCESS_SESSIONS = 32


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
    data_path: str = "direct"  # direct: proxy -> replica's own port; serve: every frame through Ray
    direct_host: str | None = None  # the replica's listen address (None: the node's IP as Ray reports it)
    direct_port_range: tuple[int, int] | None = None  # [first, last] port to try (None: any free port)
    lease_ttl_s: float = 10.0  # a direct-path token not used within this expires (and frees the slot)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ClusterConfigError("replicas must be >= 1")
        if self.data_path not in DATA_PATHS:
            raise ClusterConfigError(f"data_path must be one of {', '.join(DATA_PATHS)} (got {self.data_path!r})")
        if self.lease_ttl_s <= 0:
            raise ClusterConfigError("lease_ttl_s must be > 0")
        if self.direct_port_range is not None:
            ports = self.direct_port_range
            if (len(ports) != 2 or not all(isinstance(p, int) and not isinstance(p, bool) for p in ports)
                    or not 1 <= ports[0] <= ports[1] <= 65535):
                raise ClusterConfigError("direct_port_range must be [first, last] with 1 <= first <= last <= 65535")
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
        if isinstance(values.get("direct_port_range"), list):
            values["direct_port_range"] = tuple(values["direct_port_range"])
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


def load_replica_config(server_config: str | Path | None, overrides: list[str] | tuple[str, ...],
                        data_path: str = "direct"):
    """The `realtime-ming serve` config every replica loads (`server_config` plus `overrides`), checked by
    `check_replica_config`; raises `server.config.ConfigError` for a bad file or key, ClusterConfigError for
    a setting a replica cannot honour."""
    from ..server.config import load_serve_config

    cfg = load_serve_config(server_config, list(overrides))
    check_replica_config(cfg, data_path)
    return cfg


def check_replica_config(cfg: Any, data_path: str = "direct") -> None:
    """Refuse (ClusterConfigError) a server config a replica would otherwise ignore in part.

    On the `direct` data path a replica runs the front-end processes of `server.frontend_processes`
    (cluster/replica_frontends.py); on `serve` every session is a request Serve hands the actor, so
    there it serves them in its own process and any value but 1 is an error, not a silent no-op.
    """
    n = cfg.server.frontend_processes
    if n != 1 and data_path != "direct":
        raise ClusterConfigError(
            f"server.frontend_processes={n} with data_path: {data_path}: Serve hands every session to the replica's "
            "actor, which cannot pass it to front-end processes; set it to 1 (and add replicas), or use "
            "data_path: direct")


def serving_processes(cfg: Any, data_path: str = "direct") -> int:
    """The processes that serve a replica's sessions: its front ends on the direct data path, else the actor."""
    return cfg.server.frontend_processes if data_path == "direct" else 1
