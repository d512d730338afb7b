"""`realtime-ming serve-cluster`: the realtime server on Ray Serve (needs `pip install realtime-ming[cluster]`)."""

from __future__ import annotations

import argparse
import dataclasses

from .config import ClusterConfigError, load_cluster_config

__all__ = ["add_arguments", "run"]

_MISSING = ("Ray Serve is not installed: pip install 'realtime-ming[cluster]' (or run `realtime-ming serve` "
            "for one server)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster-config", metavar="FILE", help="cluster YAML (see configs/cluster-*.yaml)")
    parser.add_argument("--config", metavar="FILE", help="the `realtime-ming serve` config every replica loads")
    parser.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                        help="override one server config key on every replica (repeatable)")
    parser.add_argument("--hook", dest="hooks", metavar="NAME=VALUE", action="append", default=[],
                        help="tests and benchmarks only: an engine hook on every replica, as `serve --hook`")
    parser.add_argument("--replicas", type=int, help="fixed number of replicas (ignored with autoscaling)")
    parser.add_argument("--num-gpus", type=float, help="GPUs per replica (Ray ray_actor_options.num_gpus)")
    parser.add_argument("--num-cpus", type=float, help="CPUs per replica")
    parser.add_argument("--host", help="interface of Serve's HTTP proxy")
    parser.add_argument("--port", type=int, help="port of Serve's HTTP proxy")
    parser.add_argument("--address", help="Ray cluster to join (e.g. auto, ray://head:10001); default: start Ray here")
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")


def run(args: argparse.Namespace) -> int:
    from ..engine.hooks import parse_hooks
    from ..server.startup import fail_start as _fail

    try:
        import ray  # noqa: F401
    except ImportError:
        return _fail(_MISSING)
    try:
        cluster = load_cluster_config(args.cluster_config)
        changes = {"server_config": args.config, "replicas": args.replicas, "num_gpus": args.num_gpus,
                   "num_cpus": args.num_cpus, "host": args.host, "port": args.port}
        changes = {k: v for k, v in changes.items() if v is not None}
        if args.overrides:
            changes["overrides"] = (*cluster.overrides, *args.overrides)
        cluster = dataclasses.replace(cluster, **changes)
        hooks = parse_hooks(args.hooks)
    except (ClusterConfigError, ValueError) as exc:
        return _fail(f"cluster config error: {exc}")
    from ..server.config import ConfigError
    from ..server.startup import StartupError, prepare
    from .config import load_replica_config

    try:  # the replicas' config is checked here first: a bad one fails in a moment, not per replica
        prepare(load_replica_config(cluster.server_config, cluster.overrides, cluster.data_path))
    except ClusterConfigError as exc:
        return _fail(f"cluster config error: {exc}")
    except (ConfigError, StartupError) as exc:
        return _fail(exc)
    from .app import run_cluster

    return run_cluster(cluster, address=args.address, hooks=hooks)
