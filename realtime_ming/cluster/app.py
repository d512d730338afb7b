"""Ray Serve applications of the cluster and `realtime-ming serve-cluster`.

Two Serve applications share the HTTP proxy: the replicas at `/v1/realtime` (one engine each,
`max_ongoing_requests` = session capacity, so a WebSocket is one request for its life and a full
replica is never chosen) and the front at `/` (health, models, metrics, demo; no GPU, no engine).
Keeping HTTP off the replicas means a /health poll never takes a session slot.

`build_apps(cluster_cfg)` returns both bound applications; `app_builder` / `front_builder` are
the import paths for a `serve run` / `serve deploy` config (configs/cluster-serve.yaml);
`run_cluster` is the CLI.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

from ..engine.hooks import EngineHooks
from .config import (
    ONE_PROCESS_SESSIONS,
    REPLICA_DEPLOYMENT,
    ClusterConfig,
    load_cluster_config,
    load_replica_config,
    serving_processes,
)

__all__ = ["REPLICA_DEPLOYMENT", "app_builder", "build_apps", "deployment_options", "front_builder", "run_cluster"]

log = logging.getLogger(__name__)

FRONT_DEPLOYMENT = "ClusterFront"
REALTIME_ROUTE = "/v1/realtime"
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "realtime_ming.cluster.proxy:middlewares"
WORKER_NICENESS_ENV = "RAY_worker_niceness"


def _server_config(cluster: ClusterConfig):
    return load_replica_config(cluster.server_config, cluster.overrides, cluster.data_path)


def deployment_options(cluster: ClusterConfig) -> dict[str, Any]:
    """Serve options of the replica deployment derived from the cluster and server configs."""
    from .replica import replica_capacity

    cfg = _server_config(cluster)
    capacity = replica_capacity(cfg)
    serving = serving_processes(cfg, cluster.data_path)
    if capacity > serving * ONE_PROCESS_SESSIONS:
        log.warning("each replica admits %d sessions (min of server.limits.max_sessions and engine.thinker.max_slots) "
                    "and serves them in %d process(es), which carry about %d real-time sessions each: set "
                    "server.limits.max_sessions=%d, or more server.frontend_processes (direct data path), in the "
                    "overrides for sessions that stay on time (docs/cluster.md)", capacity, serving,
                    ONE_PROCESS_SESSIONS, serving * ONE_PROCESS_SESSIONS)
    if serving > 1 and cluster.num_cpus < serving + 1:
        log.warning("each replica runs %d busy processes (the engine and %d front ends) but reserves num_cpus=%g from "
                    "Ray: set num_cpus: %d in the cluster config so Ray does not place more replicas on a node than its "
                    "cores carry", serving + 1, serving, cluster.num_cpus, serving + 1)
    grace = cluster.graceful_shutdown_timeout_s
    if grace is None:
        grace = cfg.server.limits.drain_timeout_s + 15.0
    options: dict[str, Any] = {
        "name": REPLICA_DEPLOYMENT,
        "max_ongoing_requests": capacity,
        "ray_actor_options": {"num_cpus": cluster.num_cpus, "num_gpus": cluster.num_gpus},
        "graceful_shutdown_timeout_s": grace,
        "graceful_shutdown_wait_loop_s": 0.5,
        "health_check_period_s": cluster.health_check_period_s,
        "health_check_timeout_s": cluster.health_check_timeout_s,
    }
    if cluster.autoscaling is not None:
        options["autoscaling_config"] = cluster.autoscaling.serve_config(capacity)
    else:
        options["num_replicas"] = cluster.replicas
    return options


def _replica_app(cluster: ClusterConfig, hooks: EngineHooks | None = None):
    from ray import serve

    from .replica import RealtimeReplica

    cls = serve.deployment(**deployment_options(cluster))(serve.ingress()(RealtimeReplica))
    return cls.bind(cluster.server_config, list(cluster.overrides), cluster.app_name, cluster.report_interval_s,
                    direct_options(cluster), hooks=hooks)


def direct_options(cluster: ClusterConfig) -> dict[str, Any] | None:
    """The replica's direct port (cluster/direct.py `DirectPort` arguments), None on the serve data path."""
    if cluster.data_path != "direct":
        return None
    return {"host": cluster.direct_host, "port_range": cluster.direct_port_range, "lease_ttl_s": cluster.lease_ttl_s}


def _front_app(cluster: ClusterConfig):
    from ray import serve

    from .front import ClusterFront

    web_dir = _server_config(cluster).server.web_dir
    cls = serve.deployment(name=FRONT_DEPLOYMENT, num_replicas=1, max_ongoing_requests=256,
                           ray_actor_options={"num_cpus": 0})(serve.ingress()(ClusterFront))
    return cls.bind(cluster.app_name, REPLICA_DEPLOYMENT, cluster.report_interval_s, cluster.replica_stale_s, web_dir)


def build_apps(cluster: ClusterConfig, hooks: EngineHooks | None = None) -> dict[str, tuple[Any, str]]:
    """Serve application name -> (bound application, route prefix); `hooks`: every replica engine's test and
    benchmark hooks (`serve-cluster --hook`)."""
    return {
        cluster.app_name: (_replica_app(cluster, hooks), REALTIME_ROUTE),
        f"{cluster.app_name}-front": (_front_app(cluster), "/"),
    }


def app_builder(args: dict[str, Any]):
    """`import_path` of the replica application in a Serve config; `args` are cluster config keys."""
    return _replica_app(load_cluster_config(None, **dict(args or {})))


def front_builder(args: dict[str, Any]):
    """`import_path` of the front application in a Serve config; `args` as for `app_builder`."""
    return _front_app(load_cluster_config(None, **dict(args or {})))


def proxy_env(cluster: ClusterConfig) -> dict[str, str]:
    """The environment Ray needs for the cluster, also set in this process: a Ray instance started from
    here (ray.init without an address) passes it to its raylet, proxies and replicas. A Ray cluster
    started elsewhere (`ray start`, KubeRay) needs it on every node (docs/cluster.md).

    * the realtime middleware of Serve's proxy (cluster/proxy.py), its admission wait and the Serve
      application whose replicas grant direct-path leases;
    * `RAY_worker_niceness=0`: Ray runs its workers (Serve's proxy and the replicas) at nice 15 by
      default, so on a machine with other busy processes the realtime path would get the leftovers
      of the CPU (measured: +60 ms TTFA_server p50 for the tiny model on a busy 2-core box)."""
    import os

    env = {PROXY_CALLBACK_ENV: PROXY_CALLBACK, "REALTIME_MING_ADMISSION_WAIT_S": str(cluster.admission_wait_s),
           "REALTIME_MING_APP_NAME": cluster.app_name, WORKER_NICENESS_ENV: "0"}
    os.environ.update(env)
    return env


def start_serve(cluster: ClusterConfig, address: str | None = None, hooks: EngineHooks | None = None) -> None:
    """Connect to (or start) Ray, start Serve's proxy with the realtime middleware, deploy both applications."""
    import ray
    from ray import serve

    proxy_env(cluster)
    if not ray.is_initialized():
        ray.init(address=address, namespace="serve", log_to_driver=False)
    serve.start(http_options={"host": cluster.host, "port": cluster.port})
    # both applications at once: the front starts while the replicas load their engines
    serve.run_many([serve.RunTarget(target=app, name=name, route_prefix=prefix)
                    for name, (app, prefix) in build_apps(cluster, hooks).items()])


def run_cluster(cluster: ClusterConfig, address: str | None = None, hooks: EngineHooks | None = None) -> int:
    """CLI: deploy, print the URL, serve until SIGINT/SIGTERM, then `serve.shutdown()` (replicas drain)."""
    import ray
    from ray import serve

    start_serve(cluster, address, hooks)
    print(f"realtime-ming: cluster serving on ws://{cluster.host}:{cluster.port}/v1/realtime "
          f"(health: http://{cluster.host}:{cluster.port}/health)", file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("shutting down: replicas drain (graceful_shutdown_timeout_s bounds it)")
    serve.shutdown()
    from .registry import NAMESPACE, registry_name

    try:
        ray.kill(ray.get_actor(registry_name(cluster.app_name), namespace=NAMESPACE))
    except ValueError:
        pass
    return 0
