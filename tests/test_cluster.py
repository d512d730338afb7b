"""The Ray Serve cluster end to end on CPU: a local Ray, two tiny-model replicas of 4 sessions each.

Real clients on loopback through Serve's HTTP proxy: eight concurrent spoken sessions complete with
audio and a ninth is refused like a full single server (1013, same reason); a killed replica ends
exactly its own sessions with `replica_lost` and 1012 while the other's stay usable and new sessions
succeed there; a scale-down drains the stopped replica: its live replies finish, then exactly its
sessions close with 1001 while the other's stay usable. Each session knows its replica from the
upgrade response (`x-realtime-ming-replica`). Every frame is validated against the openai SDK's
server events. Marked `ray` (Ray and the replicas take a minute or more to start on a small
machine); `.ci/run` runs it. One module-wide cluster serves every test: three replica starts in all
(two, then the killed one's replacement, which loads while the kill test finishes).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from actor_fake_support import ActorMethod
from server_support import WsClient, espeak, pcm16_b64, seconds
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from realtime_ming.protocol import Dialect

ray = pytest.importorskip("ray", reason="the cluster extra is not installed (pip install 'realtime-ming[cluster]')")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parent.parent
MAX_SESSIONS = 4
APP = "realtime-ming"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, method: str = "GET", data: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=seconds(30)) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=seconds(30)) as reply:
        return reply.read().decode()


async def _ready_within(base: str, status: int, timeout_s: float = 3.0) -> dict:
    """/health/ready's payload once it answers `status`; AssertionError if it has not within `timeout_s`
    (a replica reports within 0.1 s of a session opening or ending, and /health re-reads the reports)."""
    deadline = time.monotonic() + seconds(timeout_s)
    while True:
        got, payload = await asyncio.to_thread(_get, f"{base}/health/ready")
        if got == status:
            return payload
        assert time.monotonic() < deadline, f"/health/ready still {got} after {timeout_s} s: {payload}"
        await asyncio.sleep(0.05)


def _wait_healthy(base: str, replicas: int, timeout_s: float = 420) -> dict:
    """Poll /health until `replicas` replicas are healthy (bounded: a replica loads in ~20-60 s on a busy 2-core box)."""
    deadline = time.monotonic() + seconds(timeout_s)
    payload: dict = {}
    while time.monotonic() < deadline:
        try:
            status, payload = _get(f"{base}/health")
            if status == 200 and payload.get("healthy_replicas") == replicas:
                return payload
        except (OSError, ValueError):  # not listening yet, or Serve's own 404 text before the front is up
            pass
        time.sleep(0.5)
    raise AssertionError(f"cluster not healthy with {replicas} replica(s): {payload}")


def _serve_config(port: int, replicas: int):
    """The Serve config of the cluster, as `serve deploy` / KubeRay apply it (docs/cluster.md): the replica
    count is the deployment's `num_replicas`, so changing it is a lightweight update (no restart of the others)."""
    from ray.serve.schema import ServeDeploySchema

    from realtime_ming.cluster.app import (
        FRONT_DEPLOYMENT,
        REALTIME_ROUTE,
        REPLICA_DEPLOYMENT,
    )

    args = {"port": port, "num_cpus": 1, "replica_stale_s": 3.0,
            "overrides": [f"server.limits.max_sessions={MAX_SESSIONS}", "server.limits.drain_timeout_s=60"]}
    return ServeDeploySchema.model_validate({"applications": [
        {"name": APP, "route_prefix": REALTIME_ROUTE, "import_path": "realtime_ming.cluster.app:app_builder",
         "args": args, "deployments": [{"name": REPLICA_DEPLOYMENT, "num_replicas": replicas}]},
        {"name": f"{APP}-front", "route_prefix": "/", "import_path": "realtime_ming.cluster.app:front_builder",
         "args": args, "deployments": [{"name": FRONT_DEPLOYMENT}]},
    ]})


def _deploy(port: int, replicas: int) -> None:
    from ray.serve.context import _get_global_client

    _get_global_client().deploy_apps(_serve_config(port, replicas))


@pytest.fixture(scope="module")
def cluster():
    from ray import serve

    from realtime_ming.cluster.app import proxy_env
    from realtime_ming.cluster.config import load_cluster_config

    port = _free_port()
    env = proxy_env(load_cluster_config(None, port=port))  # before ray.init: the proxy processes inherit it
    # 3 CPUs: two replicas and a spare (Ray prestarts a worker per CPU; more would only compete for the cores)
    ray.init(num_cpus=3, include_dashboard=False, namespace="serve", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), **env}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        _deploy(port, 2)  # both applications at once
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base, 2)
        yield {"base": base, "ws": f"ws://127.0.0.1:{port}/v1/realtime", "port": port}
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    return espeak("What time is it now?", tmp_path_factory.mktemp("speech"))


async def _open(url: str) -> WsClient:
    """A GA session without turn detection; `client.replica` is the replica that accepted it."""
    from realtime_ming.cluster.replica import REPLICA_HEADER

    client = WsClient(await connect(url, open_timeout=seconds(60), ping_interval=None), Dialect.GA)
    client.replica = client.ws.response.headers.get(REPLICA_HEADER)
    assert client.replica, f"no {REPLICA_HEADER} on the upgrade response"
    assert (await client.recv(timeout=30))["type"] == "session.created"
    await client.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    await client.recv_until("session.updated", timeout=30)
    return client


async def _open_full(url: str) -> list[WsClient]:
    """Both replicas filled: 2 x MAX_SESSIONS sessions, MAX_SESSIONS on each."""
    clients = await asyncio.gather(*(_open(url) for _ in range(2 * MAX_SESSIONS)))
    counts: dict[str, int] = {}
    for c in clients:
        counts[c.replica] = counts.get(c.replica, 0) + 1
    assert sorted(counts.values()) == [MAX_SESSIONS, MAX_SESSIONS], counts  # a full replica is never chosen
    return clients


async def _spoken_turn(client: WsClient, speech: np.ndarray) -> dict:
    """Speech in 100 ms appends, commit, response.create; returns response.done after counting audio."""
    step = 2400
    for start in range(0, speech.size, step):
        await client.send(type="input_audio_buffer.append", audio=pcm16_b64(speech[start:start + step]))
    await client.send(type="input_audio_buffer.commit")
    await client.send(type="response.create")
    frames = await client.recv_until("response.done", timeout=240)
    audio = sum(1 for f in frames if f["type"] == "response.output_audio.delta")
    done = frames[-1]
    done["_audio_deltas"] = audio
    return done


async def _closed(client: WsClient, timeout: float = 120) -> tuple[int | None, str, list[dict]]:
    """Read until the server closes: (close code, reason, frames received on the way); TimeoutError past `timeout`."""
    frames = []
    try:
        async with asyncio.timeout(seconds(timeout)):
            while True:
                frames.append(await client.recv(timeout=timeout))
    except ConnectionClosed:
        pass
    return client.ws.close_code, client.ws.close_reason or "", frames


async def _long_reply(client: WsClient, max_tokens: int = 400, until: str = "response.output_audio.delta") -> None:
    """A text-prompted spoken reply; returns at its first `until` event (by default its first audio delta)."""
    await client.send(type="conversation.item.create",
                      item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]})
    await client.send(type="response.create", response={"max_output_tokens": max_tokens})
    await client.recv_until(until, timeout=180)


async def _still_serving(client: WsClient) -> dict:
    """Cancel the reply in progress (frees the CPU for the others), then prove the session still answers."""
    await client.send(type="response.cancel")
    done = (await client.recv_until("response.done", timeout=120))[-1]
    await client.send(type="session.update", session={"type": "realtime", "instructions": "Be brief."})
    await client.recv_until("session.updated", timeout=30)
    return done


async def test_a_replica_reports_a_session_opening_or_ending_at_once():
    """Not only every `report_interval_s`: within the replica's watch step of the count changing (no Ray)."""
    from types import SimpleNamespace

    from realtime_ming.cluster.replica import RealtimeReplica

    replica = object.__new__(RealtimeReplica)
    replica.replica_id, replica.frontends, replica._report_interval_s = "r", None, 3600.0
    replica.server = SimpleNamespace(num_sessions=0)
    replica._registry = SimpleNamespace(report=ActorMethod())
    replica.report = lambda: {"sessions": replica._sessions()}
    task = asyncio.create_task(replica._report_loop())
    try:
        await asyncio.sleep(0.3)
        replica.server.num_sessions = 1
        await asyncio.sleep(0.3)
        replica.server.num_sessions = 0
        await asyncio.sleep(0.3)
    finally:
        task.cancel()
    assert [report["sessions"] for _, report in replica._registry.report.calls] == [0, 1, 0]


async def test_health_models_metrics_and_voices_over_both_replicas(cluster):
    from realtime_ming.cluster.proxy import VOICES_UNSUPPORTED

    status, health = _get(f"{cluster['base']}/health")
    assert status == 200 and health["status"] == "ok"
    assert health["capacity"] == 2 * MAX_SESSIONS and len(health["replicas"]) == 2
    status, models = _get(f"{cluster['base']}/v1/models")
    assert status == 200 and models["data"][0]["object"] == "model"
    text = await asyncio.to_thread(_text, f"{cluster['base']}/metrics")
    ids = {r["replica"] for r in health["replicas"]}
    for rid in ids:
        assert f'realtime_ming_sessions{{replica="{rid}"}}' in text
    assert "realtime_ming_cluster_capacity 8.0" in text
    assert 'realtime_ming_cluster_replicas{state="healthy"} 2.0' in text
    # voice cloning is per replica memory: the cluster refuses it clearly instead of half-working
    for method, path, data in (("GET", "/v1/realtime/voices", None), ("POST", "/v1/realtime/voices", b"x"),
                               ("DELETE", "/v1/realtime/voices/custom:abc", None)):
        status, body = _get(cluster["base"] + path, method, data)
        assert status == 501 and body["error"]["code"] == VOICES_UNSUPPORTED, (method, path, status, body)
    # a session names its replica, one of those /health reports
    client = await _open(cluster["ws"])
    assert client.replica in ids
    await client.ws.close()


async def test_eight_spoken_sessions_complete_and_a_ninth_is_refused(cluster, speech):
    from realtime_ming.cluster.proxy import FULL_REASON

    clients = await _open_full(cluster["ws"])
    try:
        ninth = await connect(cluster["ws"], open_timeout=seconds(60))
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ninth.recv(), seconds(30))
        assert (ninth.close_code, ninth.close_reason) == (1013, FULL_REASON)
        ready = await _ready_within(cluster["base"], 503)
        assert ready["reason"] == "every replica is full" and ready["free_sessions"] == 0
        dones = await asyncio.gather(*(_spoken_turn(c, speech) for c in clients))
        for done in dones:
            assert done["response"]["status"] in ("completed", "incomplete"), done["response"]
            assert done["_audio_deltas"] > 0
    finally:
        await asyncio.gather(*(c.ws.close() for c in clients))
    assert (await _ready_within(cluster["base"], 200))["free_sessions"] > 0  # ready again as sessions end


async def test_killed_replica_ends_its_sessions_cleanly_and_the_other_serves(cluster, speech):
    clients = await _open_full(cluster["ws"])
    await asyncio.gather(*(_long_reply(c) for c in clients))
    _, health = _get(f"{cluster['base']}/health")
    victim = health["replicas"][0]
    ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=True)
    lost = [c for c in clients if c.replica == victim["replica"]]
    kept = [c for c in clients if c.replica != victim["replica"]]
    assert len(lost) == len(kept) == MAX_SESSIONS

    lost_results, kept_results = await asyncio.gather(
        asyncio.gather(*(_closed(c, timeout=120) for c in lost)),
        asyncio.gather(*(_still_serving(c) for c in kept)))
    for code, reason, frames in lost_results:
        assert code == 1012 and reason, (code, reason)
        assert frames[-1]["type"] == "error" and frames[-1]["error"]["code"] == "replica_lost", frames[-1:]
    for done in kept_results:
        assert done["response"]["status"] in ("cancelled", "completed", "incomplete"), done["response"]
    await asyncio.gather(*(c.ws.close() for c in kept))
    # new sessions go to the survivor (Serve is replacing the dead replica meanwhile)
    fresh = await _open(cluster["ws"])
    assert fresh.replica != victim["replica"]
    done = await _spoken_turn(fresh, speech)
    assert done["response"]["status"] in ("completed", "incomplete") and done["_audio_deltas"] > 0
    await fresh.ws.close()
    # /health calls the dead replica down once its reports stop for replica_stale_s (3 s here), and keeps serving
    deadline = time.monotonic() + seconds(30)
    while True:
        status, health = await asyncio.to_thread(_get, f"{cluster['base']}/health")
        states = {r["replica"]: r["state"] for r in health["replicas"]}
        if states.get(victim["replica"], "down") == "down":
            break
        assert time.monotonic() < deadline, health
        await asyncio.sleep(0.5)
    assert status == 200 and health["healthy_replicas"] >= 1, health


async def _draining_replica(base: str, timeout_s: float = 120) -> str:
    """The replica /health reports `draining` (polled; bounded)."""
    async with asyncio.timeout(seconds(timeout_s)):
        while True:
            _, health = await asyncio.to_thread(_get, f"{base}/health")
            draining = [r["replica"] for r in health.get("replicas", []) if r["state"] == "draining"]
            if draining:
                return draining[0]
            await asyncio.sleep(0.2)


async def test_scale_down_drains_live_replies_then_closes_1001(cluster):
    _wait_healthy(cluster["base"], 2)  # the killed replica's replacement (it loads while the kill test ends)
    clients = await _open_full(cluster["ws"])
    # the scale-down starts while every reply is live but before its first audio: on a 2-core box a reply's
    # audio comes ~2 s before its end, so a stop issued after the first audio could land after the reply
    await asyncio.gather(*(_long_reply(c, until="response.created") for c in clients))
    scale_down = asyncio.create_task(asyncio.to_thread(_deploy, cluster["port"], 1))  # 2 -> 1 replica
    stopped = await _draining_replica(cluster["base"])
    draining_seen = time.monotonic()
    drained = [c for c in clients if c.replica == stopped]
    kept = [c for c in clients if c.replica != stopped]
    assert len(drained) == len(kept) == MAX_SESSIONS  # one replica stops (a scale-down, not a rolling restart)

    async def drained_outcome(client: WsClient):
        frames = await client.recv_until("response.done", timeout=240)  # the live reply finishes
        arrived = time.monotonic()
        audio = sum(1 for f in client.frames if f["type"] == "response.output_audio.delta")
        code, reason, _ = await _closed(client, timeout=60)  # then the session closes: going away
        return frames[-1]["response"]["status"], arrived, audio, code, reason

    results, kept_dones = await asyncio.gather(asyncio.gather(*(drained_outcome(c) for c in drained)),
                                               asyncio.gather(*(_still_serving(c) for c in kept)))
    for status, arrived, audio, code, _reason in results:
        assert status in ("completed", "incomplete") and audio > 0, results  # not cut by the drain
        assert arrived > draining_seen, results  # the reply was still live when the drain began
        assert code == 1001, results
    for done in kept_dones:  # the other replica's sessions were left alone and still answer
        assert done["response"]["status"] in ("cancelled", "completed", "incomplete"), done["response"]
    assert all(c.ws.close_code is None for c in kept)
    await scale_down
    _, health = _get(f"{cluster['base']}/health")
    assert health["healthy_replicas"] == 1 and health["capacity"] == MAX_SESSIONS, health
    await asyncio.gather(*(c.ws.close() for c in clients))
