"""The cluster's pieces that need no Ray: the proxy middleware's admission and replica-loss answers,
the metrics aggregation, replica states and the cluster config."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from actor_fake_support import ActorMethod
from prometheus_client.parser import text_string_to_metric_families

from realtime_ming.cluster.config import ClusterConfigError, load_cluster_config
from realtime_ming.cluster.front import replica_states
from realtime_ming.cluster.metrics import render_cluster_metrics
from realtime_ming.cluster.proxy import FULL_REASON, RealtimeProxyMiddleware
from realtime_ming.server.metrics import ServerMetrics

SCOPE = {"type": "websocket", "path": "/v1/realtime", "query_string": b"", "headers": [], "subprotocols": ["realtime"]}


async def _run(app, wait_s: float = 0.2) -> list[dict]:
    sent: list[dict] = []

    async def receive():
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    await RealtimeProxyMiddleware(app, admission_wait_s=wait_s)(dict(SCOPE), receive, send)
    return sent


async def test_no_replica_answering_in_time_is_refused_like_a_full_server():
    cancelled = asyncio.Event()

    async def queued_forever(scope, receive, send):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    sent = await _run(queued_forever)
    assert sent == [{"type": "websocket.accept", "subprotocol": "realtime"},
                    {"type": "websocket.close", "code": 1013, "reason": FULL_REASON}]
    assert cancelled.is_set()  # the queued request is withdrawn


async def test_replica_lost_after_accept_gets_an_error_event_and_1012():
    async def dies(scope, receive, send):
        await send({"type": "websocket.accept", "subprotocol": "realtime"})
        raise RuntimeError("actor died")

    sent = await _run(dies)
    assert sent[0]["type"] == "websocket.accept"
    event = json.loads(sent[1]["text"])
    assert event["type"] == "error" and event["error"]["code"] == "replica_lost"
    assert sent[2]["type"] == "websocket.close" and sent[2]["code"] == 1012


async def test_a_session_the_replica_closed_passes_through_untouched():
    async def normal(scope, receive, send):
        await send({"type": "websocket.accept", "subprotocol": None})
        await send({"type": "websocket.close", "code": 1000, "reason": ""})

    sent = await _run(normal)
    assert [m["type"] for m in sent] == ["websocket.accept", "websocket.close"] and sent[1]["code"] == 1000


def _report(rid: str, sessions: int, ttfa: list[float]) -> dict:
    metrics = ServerMetrics()
    metrics.sessions.set(sessions)
    for value in ttfa:
        metrics.ttfa.observe(value)
    return {"replica": rid, "capacity": 4, "sessions": sessions, "alive": True, "draining": False,
            "metrics": metrics.render().decode(), "age_s": 0.1}


def test_cluster_metrics_keep_each_replica_and_sum_them():
    reports = [_report("a", 3, [0.1, 0.2]), _report("b", 1, [0.3])]
    text = render_cluster_metrics(reports, {"a": "healthy", "b": "healthy"}).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("realtime_ming_sessions", (("replica", "a"),))] == 3
    assert samples[("realtime_ming_cluster_sessions", ())] == 4
    assert samples[("realtime_ming_cluster_ttfa_seconds_count", ())] == 3
    assert samples[("realtime_ming_cluster_capacity", ())] == 8
    down = render_cluster_metrics(reports, {"a": "healthy", "b": "down"}).decode()
    assert 'realtime_ming_sessions{replica="b"}' not in down and "realtime_ming_cluster_sessions 3.0" in down


def test_a_replicas_front_end_metrics_sum_into_one_exposition_of_the_same_names():
    """A replica with front-end processes reports their metrics summed (cluster/replica_frontends.py), under the
    single server's names, so the cluster's per-replica and total series mean what they mean without them."""
    from realtime_ming.cluster.metrics import sum_expositions

    text = sum_expositions([_report("a", 3, [0.1, 0.2])["metrics"], _report("a", 1, [0.3])["metrics"]])
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("realtime_ming_sessions", ())] == 4
    assert samples[("realtime_ming_ttfa_seconds_count", ())] == 3
    assert abs(samples[("realtime_ming_ttfa_seconds_sum", ())] - 0.6) < 1e-9
    assert not any(name.endswith("_created") for name, _ in samples)
    summed = render_cluster_metrics([{**_report("a", 0, []), "metrics": text}], {"a": "healthy"}).decode()
    assert "realtime_ming_cluster_sessions 4.0" in summed
    assert sum_expositions([]) == ""


def test_replica_states_from_reports():
    reports = {"a": {"alive": True, "age_s": 0.2}, "b": {"alive": True, "age_s": 9.0},
               "c": {"alive": False, "age_s": 0.1}, "d": {"alive": True, "draining": True, "age_s": 0.1}}
    assert replica_states(reports, 5.0) == {"a": "healthy", "b": "down", "c": "down", "d": "draining"}


def test_cluster_config_rejects_unknown_and_bad_keys(tmp_path):
    with pytest.raises(ClusterConfigError, match="replica"):
        load_cluster_config(None, replica=2)
    with pytest.raises(ClusterConfigError, match="target_fraction"):
        load_cluster_config(None, autoscaling={"target_fraction": 0})
    cfg = load_cluster_config(None, autoscaling={"max_replicas": 3})
    assert cfg.autoscaling.serve_config(8)["target_ongoing_requests"] == 6.0


@pytest.mark.parametrize("method,path", [("POST", "/v1/realtime/voices"), ("GET", "/v1/realtime/voices"),
                                         ("GET", "/v1/realtime/voices/custom:abc?x=1"),
                                         ("DELETE", "/v1/realtime/voices/custom:abc")])
async def test_voice_routes_are_refused_with_501_naming_why(method, path):
    from realtime_ming.cluster.proxy import VOICES_UNSUPPORTED
    from realtime_ming.server.voice_routes import VOICES_PATH

    called = []

    async def replica(scope, receive, send):
        called.append(scope)

    target, _, query = path.partition("?")
    scope = {"type": "http", "method": method, "path": target, "query_string": query.encode(), "headers": []}
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    await RealtimeProxyMiddleware(replica)(scope, None, send)
    assert not called  # no replica (no session slot) is used
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 501
    assert dict(sent[0]["headers"])[b"content-type"] == b"application/json"
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == VOICES_UNSUPPORTED and "replica" in error["message"]
    assert path.startswith(VOICES_PATH)  # the proxy's copy of the path is the voice routes' own


async def test_other_http_requests_pass_through_the_middleware():
    called = []

    async def replica(scope, receive, send):
        called.append(scope["path"])

    for path in ("/v1/realtime", "/v1/realtime/voicesX", "/health"):
        await RealtimeProxyMiddleware(replica)({"type": "http", "path": path, "query_string": b"", "headers": []},
                                               None, None)
    assert called == ["/v1/realtime", "/v1/realtime/voicesX", "/health"]



def test_cluster_config_data_path_keys():
    from realtime_ming.cluster.app import direct_options

    cfg = load_cluster_config(None, direct_port_range=[8100, 8131])
    assert cfg.data_path == "direct" and cfg.direct_port_range == (8100, 8131)
    assert direct_options(cfg) == {"host": None, "port_range": (8100, 8131), "lease_ttl_s": cfg.lease_ttl_s}
    assert direct_options(load_cluster_config(None, data_path="serve")) is None
    for bad, key in (({"data_path": "grpc"}, "data_path"), ({"direct_port_range": [9000, 8000]}, "direct_port_range"),
                     ({"direct_port_range": [8000]}, "direct_port_range"), ({"lease_ttl_s": 0}, "lease_ttl_s")):
        with pytest.raises(ClusterConfigError, match=key):
            load_cluster_config(None, **bad)


def test_a_replica_admitting_more_sessions_than_one_process_carries_is_warned_of(caplog):
    """A replica serves its sessions in one process: a capacity above ONE_PROCESS_SESSIONS is said at build time
    (naming the override that fixes it), one within it is not."""
    from realtime_ming.cluster.app import deployment_options
    from realtime_ming.cluster.config import ONE_PROCESS_SESSIONS

    big = load_cluster_config(None, overrides=["server.frontend_processes=1", "server.limits.max_sessions=64",
                                               "engine.thinker.max_slots=64"])
    with caplog.at_level("WARNING", logger="realtime_ming.cluster.app"):
        assert deployment_options(big)["max_ongoing_requests"] == 64
    assert f"server.limits.max_sessions={ONE_PROCESS_SESSIONS}" in caplog.text and "admits 64 sessions" in caplog.text
    caplog.clear()
    fits = load_cluster_config(None, overrides=["server.frontend_processes=1",
                                                f"server.limits.max_sessions={ONE_PROCESS_SESSIONS}",
                                                "engine.thinker.max_slots=64"])
    with caplog.at_level("WARNING", logger="realtime_ming.cluster.app"):
        assert deployment_options(fits)["max_ongoing_requests"] == ONE_PROCESS_SESSIONS
    assert "admits" not in caplog.text


def test_front_end_processes_are_a_replicas_on_the_direct_data_path_and_refused_on_serve(tmp_path, caplog):
    """On the direct data path a replica runs `server.frontend_processes` (cluster/replica_frontends.py) and carries
    ONE_PROCESS_SESSIONS per process before the warning; on `serve` (every session handed to the actor) any value
    but 1 is a config error, not a silent no-op, refused before Ray starts."""
    import subprocess
    import sys
    from pathlib import Path

    from realtime_ming.cluster.app import deployment_options
    from realtime_ming.cluster.config import ONE_PROCESS_SESSIONS, load_replica_config

    served = tmp_path / "serve.yaml"
    served.write_text("server:\n  frontend_processes: 4\n  limits:\n    max_sessions: 64\n"
                      "engine:\n  thinker:\n    max_slots: 64\n")
    direct = load_cluster_config(None, server_config=str(served))
    assert load_replica_config(direct.server_config, direct.overrides).server.frontend_processes == 4
    with caplog.at_level("WARNING", logger="realtime_ming.cluster.app"):
        assert deployment_options(direct)["max_ongoing_requests"] == 64 <= ONE_PROCESS_SESSIONS * 4
    assert "admits" not in caplog.text  # 4 processes carry 64
    assert "runs 5 busy processes" in caplog.text and "set num_cpus: 5" in caplog.text  # num_cpus 1 by default
    caplog.clear()
    with caplog.at_level("WARNING", logger="realtime_ming.cluster.app"):
        deployment_options(dataclasses.replace(direct, num_cpus=5))
    assert "busy processes" not in caplog.text
    for cluster in (load_cluster_config(None, overrides=["server.frontend_processes=2"], data_path="serve"),
                    load_cluster_config(None, server_config=str(served), data_path="serve")):
        with pytest.raises(ClusterConfigError, match=r"server\.frontend_processes=\d with data_path: serve"):
            load_replica_config(cluster.server_config, cluster.overrides, cluster.data_path)
        with pytest.raises(ClusterConfigError, match="frontend_processes"):
            deployment_options(cluster)  # what `run_cluster` / a `serve deploy` build calls first
    root = Path(__file__).resolve().parents[1]
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text("data_path: serve\n")
    done = subprocess.run([sys.executable, "-m", "realtime_ming.cli", "serve-cluster", "--cluster-config",
                           str(cluster_file), "--set", "server.frontend_processes=2"], check=False, cwd=root,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "cluster config error: server.frontend_processes=2 with data_path: serve" in done.stderr
    assert "Ray" not in done.stderr.split("cluster config error")[0]  # refused before any Ray start


class _Registry:
    """A fake registry actor: `snapshot` answers the current table (or raises while `down`), `prune` does nothing."""

    def __init__(self, reports: dict) -> None:
        self.reports, self.down = reports, False
        self.snapshot, self.prune = ActorMethod(self._snapshot), ActorMethod()

    def _snapshot(self) -> dict:
        if self.down:
            raise ConnectionError("registry restarting")
        return {rid: dict(rep) for rid, rep in self.reports.items()}


def _front_report(sessions: int, capacity: int = 4) -> dict:
    return {"alive": True, "draining": False, "sessions": sessions, "capacity": capacity, "age_s": 0.0,
            "health": {}, "models": None, "metrics": ""}


async def _front(monkeypatch, registry: _Registry, stale_s: float = 5.0):
    """A ClusterFront on a fake registry whose periodic refresh never comes (an hour apart)."""
    from realtime_ming.cluster import front as front_module
    from realtime_ming.cluster import registry as registry_module

    monkeypatch.setattr(registry_module, "registry_actor", lambda app_name: registry)
    monkeypatch.setattr(front_module.ClusterFront, "_serve_status", lambda self: {"status": "HEALTHY"})
    front = object.__new__(front_module.ClusterFront)
    await front.__init__("app", "replica", 3600.0, stale_s)
    return front


async def _get(front, path: str) -> tuple[int, dict]:
    app = front.__serve_build_asgi_app__()
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": []}
    await app(scope, None, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


async def test_health_ready_reads_the_replicas_reports_afresh(monkeypatch):
    """A replica that just filled turns /health/ready 503 on the next probe, not a refresh interval later."""
    registry = _Registry({"a": _front_report(3)})
    front = await _front(monkeypatch, registry)
    try:
        assert (await _get(front, "/health/ready"))[0] == 200
        registry.reports["a"] = _front_report(4)
        await asyncio.sleep(0.12)  # past the front's freshness window
        status, ready = await _get(front, "/health/ready")
        assert (status, ready["reason"], ready["free_sessions"]) == (503, "every replica is full", 0)
        before = len(registry.snapshot.calls)
        await asyncio.gather(*(_get(front, "/health") for _ in range(5)))
        assert len(registry.snapshot.calls) - before <= 1  # probes at once share one read
    finally:
        front._task.cancel()


async def test_reports_keep_ageing_while_the_registry_cannot_be_read(monkeypatch):
    """A front that loses the registry does not keep showing its last view as healthy: the replicas go down."""
    registry = _Registry({"a": _front_report(0)})
    front = await _front(monkeypatch, registry, stale_s=0.3)
    try:
        assert (await _get(front, "/health"))[1]["status"] == "ok"
        registry.down = True
        await asyncio.sleep(0.4)
        status, health = await _get(front, "/health")
        assert (status, health["status"], health["replicas"][0]["state"]) == (503, "unavailable", "down")
        assert (await _get(front, "/health/ready"))[1]["reason"] == "no healthy replica"
        registry.down = False
        assert (await _get(front, "/health"))[1]["status"] == "ok"  # back with the registry
    finally:
        front._task.cancel()
