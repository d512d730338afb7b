"""The Ray Serve cluster end to end on CPU: a local Ray, two tiny-model replicas of 4 sessions each.

Real clients on loopback through Serve's HTTP proxy: eight concurrent spoken sessions complete with
audio and a ninth is refused like a full single server (1013, same reason); a killed replica ends
its sessions with `replica_lost` and 1012 while the other's finish and new sessions succeed there;
a scale-down drains the stopped replica: its live replies finish, then its sessions close with 1001.
Every frame is validated against the openai SDK's server events. Marked `ray` (slow: Ray and the
replicas take a minute to start); `.ci/run` runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from server_support import WsClient, espeak, pcm16_b64, seconds
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from realtime_ming.protocol import Dialect

ray = pytest.importorskip("ray", reason="the cluster extra is not installed (pip install 'realtime-ming[cluster]')")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parent.parent
MAX_SESSIONS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait_healthy(base: str, replicas: int, timeout_s: float = 300) -> dict:
    import time

    deadline = time.monotonic() + timeout_s
    payload: dict = {}
    while time.monotonic() < deadline:
        try:
            status, payload = _get(f"{base}/health")
            if status == 200 and payload.get("healthy_replicas") == replicas:
                return payload
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"cluster not healthy with {replicas} replica(s): {payload}")


def _cluster_config(replicas: int, port: int):
    from realtime_ming.cluster.config import load_cluster_config

    return load_cluster_config(None, replicas=replicas, port=port, num_cpus=1, replica_stale_s=3.0,
                               overrides=[f"server.limits.max_sessions={MAX_SESSIONS}",
                                          "server.limits.drain_timeout_s=60"])


@pytest.fixture(scope="module")
def cluster():
    from ray import serve

    from realtime_ming.cluster.app import proxy_env, start_serve

    port = _free_port()
    cfg = _cluster_config(2, port)
    env = proxy_env(cfg)  # before ray.init: the proxy processes inherit it
    ray.init(num_cpus=8, include_dashboard=False, namespace="serve", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), **env}})
    try:
        start_serve(cfg)
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
    client = WsClient(await connect(url, open_timeout=seconds(30), ping_interval=None), Dialect.GA)
    assert (await client.recv(timeout=30))["type"] == "session.created"
    await client.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    await client.recv_until("session.updated", timeout=30)
    return client


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
    """Read until the server closes: (close code, reason, frames received on the way)."""
    frames = []
    try:
        async with asyncio.timeout(seconds(timeout)):
            while True:
                frames.append(await client.recv(timeout=timeout))
    except ConnectionClosed:
        pass
    return client.ws.close_code, client.ws.close_reason or "", frames


async def test_health_models_and_metrics_cover_both_replicas(cluster):
    status, health = _get(f"{cluster['base']}/health")
    assert status == 200 and health["status"] == "ok"
    assert health["capacity"] == 2 * MAX_SESSIONS and len(health["replicas"]) == 2
    status, models = _get(f"{cluster['base']}/v1/models")
    assert status == 200 and models["data"][0]["object"] == "model"
    with urllib.request.urlopen(f"{cluster['base']}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    ids = {r["replica"] for r in health["replicas"]}
    for rid in ids:
        assert f'realtime_ming_sessions{{replica="{rid}"}}' in text
    assert "realtime_ming_cluster_capacity 8.0" in text
    assert 'realtime_ming_cluster_replicas{state="healthy"} 2.0' in text


async def test_eight_spoken_sessions_complete_and_a_ninth_is_refused(cluster, speech):
    from realtime_ming.cluster.proxy import FULL_REASON

    clients = await asyncio.gather(*(_open(cluster["ws"]) for _ in range(2 * MAX_SESSIONS)))
    try:
        ninth = await connect(cluster["ws"], open_timeout=seconds(30))
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ninth.recv(), seconds(30))
        assert (ninth.close_code, ninth.close_reason) == (1013, FULL_REASON)
        status, ready = _get(f"{cluster['base']}/health/ready")
        assert status == 503 and ready["reason"] == "every replica is full"
        dones = await asyncio.gather(*(_spoken_turn(c, speech) for c in clients))
        for done in dones:
            assert done["response"]["status"] in ("completed", "incomplete"), done["response"]
            assert done["_audio_deltas"] > 0
    finally:
        await asyncio.gather(*(c.ws.close() for c in clients))


async def _long_reply(client: WsClient, max_tokens: int = 400) -> None:
    """A text-prompted spoken reply; returns at its first audio delta."""
    await client.send(type="conversation.item.create",
                      item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]})
    await client.send(type="response.create", response={"max_output_tokens": max_tokens})
    await client.recv_until("response.output_audio.delta", timeout=120)


async def test_killed_replica_ends_its_sessions_cleanly_and_the_other_serves(cluster, speech):
    clients = await asyncio.gather(*(_open(cluster["ws"]) for _ in range(2 * MAX_SESSIONS)))
    await asyncio.gather(*(_long_reply(c) for c in clients))
    _, health = _get(f"{cluster['base']}/health")
    victim = health["replicas"][0]
    ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=True)

    async def outcome(client: WsClient):
        """lost: closed by the middleware; served: the reply finished and the session stays open."""
        try:
            done = (await client.recv_until("response.done", timeout=240))[-1]
            code, reason, _ = await _closed(client, timeout=20)
        except ConnectionClosed:
            return "lost", (client.ws.close_code, client.ws.close_reason, client.frames[-1])
        except TimeoutError:
            return "served", done
        return "lost", (code, reason, client.frames[-1])

    results = await asyncio.gather(*(outcome(c) for c in clients))
    lost = [r[1] for r in results if r[0] == "lost"]
    served = [r[1] for r in results if r[0] == "served"]
    assert len(lost) == MAX_SESSIONS and len(served) == MAX_SESSIONS, results
    for code, reason, last in lost:
        assert code == 1012 and reason
        assert last["type"] == "error" and last["error"]["code"] == "replica_lost"
    for done in served:
        assert done["response"]["status"] in ("completed", "incomplete")
    await asyncio.gather(*(c.ws.close() for c in clients))
    # the survivor takes new sessions while the dead replica is replaced
    fresh = await _open(cluster["ws"])
    done = await _spoken_turn(fresh, speech)
    assert done["response"]["status"] in ("completed", "incomplete") and done["_audio_deltas"] > 0
    await fresh.ws.close()
    status, health = _get(f"{cluster['base']}/health")
    states = {r["replica"]: r["state"] for r in health["replicas"]}
    assert states.get(victim["replica"], "down") == "down" or victim["replica"] not in states
    _wait_healthy(cluster["base"], 2)  # Serve replaced it; /health says so


async def test_scale_down_drains_live_replies_then_closes_1001(cluster):
    from ray import serve

    from realtime_ming.cluster.app import build_apps

    clients = await asyncio.gather(*(_open(cluster["ws"]) for _ in range(2 * MAX_SESSIONS)))
    await asyncio.gather(*(_long_reply(c) for c in clients))
    cfg = _cluster_config(1, cluster["port"])
    app, prefix = build_apps(cfg)[cfg.app_name]
    await asyncio.to_thread(serve.run, app, name=cfg.app_name, route_prefix=prefix, blocking=False)

    async def outcome(client: WsClient):
        frames = await client.recv_until("response.done", timeout=240)  # the live reply always finishes
        audio = sum(1 for f in client.frames if f["type"] == "response.output_audio.delta")
        try:
            code, reason, _ = await _closed(client, timeout=15)
        except TimeoutError:
            code, reason = None, "still open"
        return frames[-1]["response"]["status"], audio, code, reason

    results = await asyncio.gather(*(outcome(c) for c in clients))
    for status, audio, _code, _reason in results:
        assert status in ("completed", "incomplete") and audio > 0, results
    drained = [r for r in results if r[2] == 1001]
    assert len(drained) >= MAX_SESSIONS, results  # the stopped replica's sessions, after their replies
    assert all(r[2] in (1001, None) for r in results), results
    await asyncio.gather(*(c.ws.close() for c in clients))
