"""A cluster replica's front-end processes (cluster/replica_frontends.py), without Ray: the replica's direct port
(`DirectPort`, its `LeaseBook`) served by two spawned front ends around the embedded tiny engine, as the replica
actor runs them. Clients validate every frame. What Serve adds around it (the lease call, the proxy's relay, a
killed replica): tests/test_cluster.py and the ray-marked bench check (tests/test_bench_ray_gpu.py).
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from server_support import WsClient, http_request
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from realtime_ming.cluster.config import load_replica_config
from realtime_ming.cluster.direct import DirectPort
from realtime_ming.cluster.lease import LEASE_HEADER
from realtime_ming.cluster.replica_frontends import ReplicaFrontEnds
from realtime_ming.protocol import Dialect
from realtime_ming.server.app import FRONTEND_HEADER
from realtime_ming.server.loading import load_engine
from realtime_ming.server.startup import prepare

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # the full tier: spawned processes


async def _grant(direct: DirectPort) -> tuple[str, asyncio.Future]:
    """A lease as the replica's streaming `lease` call makes it: the token, and a future done when it ends."""
    grants = direct.grants("r-test")
    grant = await anext(grants)
    return grant["token"], asyncio.ensure_future(anext(grants, "ended"))


async def _open(port: int, token: str) -> tuple[WsClient, int]:
    ws = await connect(f"ws://127.0.0.1:{port}/v1/realtime", additional_headers={LEASE_HEADER: token})
    client = WsClient(ws, Dialect.GA)
    assert (await client.recv())["type"] == "session.created"
    return client, int(ws.response.headers[FRONTEND_HEADER])


async def _text_turn(client: WsClient) -> dict:
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]})
    await client.send(type="response.create", response={"max_output_tokens": 6})
    return (await client.recv_until("response.done", timeout=60))[-1]["response"]


async def _until(predicate, timeout_s: float = 15.0) -> None:
    for _ in range(int(timeout_s * 20)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


@pytest.fixture
async def replica():
    cfg = prepare(load_replica_config(None, ["server.frontend_processes=2", "server.limits.max_sessions=4"]))
    engine = await asyncio.to_thread(load_engine, cfg)
    direct = DirectPort("127.0.0.1", None, lease_ttl_s=30.0)
    fronts = ReplicaFrontEnds(cfg, engine, direct, report_interval_s=0.2)
    await fronts.start()
    try:
        yield fronts, direct
    finally:
        await fronts.stop()
        engine.close()


async def test_front_ends_serve_only_leased_sessions_and_end_each_lease_with_its_connection(replica):
    fronts, direct = replica
    port = direct.port
    status, _, _ = await http_request(port, "/health")
    assert status == 403  # no token: refused before any route, as on a one-process replica's port
    with pytest.raises(InvalidStatus) as refused:
        await connect(f"ws://127.0.0.1:{port}/v1/realtime", additional_headers={LEASE_HEADER: "forged"})
    assert refused.value.response.status_code == 403

    token, ended = await _grant(direct)
    client, index = await _open(port, token)
    assert index in (0, 1)
    assert (await _text_turn(client))["status"] in ("completed", "incomplete")
    assert fronts.sessions == 1
    with pytest.raises(InvalidStatus):  # single use: the same token again is refused
        await connect(f"ws://127.0.0.1:{port}/v1/realtime", additional_headers={LEASE_HEADER: token})
    assert not ended.done()  # the lease (Serve's slot for the session) lives as long as the connection
    # the front ends' metrics reach the actor, summed over the processes
    await _until(lambda: "realtime_ming_sessions_accepted_total 1.0" in fronts.metrics())
    assert "realtime_ming_sessions 1.0" in fronts.metrics()
    await client.ws.close()
    assert await asyncio.wait_for(ended, 10) == "ended"
    await _until(lambda: fronts.sessions == 0)

    # sessions spread over both front ends; each lease is its own
    leases = [await _grant(direct) for _ in range(2)]
    opened = [await _open(port, token) for token, _ in leases]
    assert {index for _, index in opened} == {0, 1}
    assert fronts.sessions == 2
    for client, _ in opened:
        await client.ws.close()
    assert [await asyncio.wait_for(done, 10) for _, done in leases] == ["ended", "ended"]


async def test_a_dead_front_end_ends_its_leases_and_is_replaced(replica):
    fronts, direct = replica
    token, ended = await _grant(direct)
    client, index = await _open(direct.port, token)
    os.kill(fronts.frontends.procs[index].pid, signal.SIGKILL)
    assert await asyncio.wait_for(ended, 10) == "ended"  # Serve's slot freed with the process
    with pytest.raises(ConnectionClosed):
        await client.recv()
    await _until(lambda: fronts.sessions == 0)
    await _until(lambda: fronts.frontends.procs[index].is_alive() and fronts.frontends.dispatcher is not None)
    token, ended = await _grant(direct)  # the replica goes on serving
    for _ in range(100):
        try:
            client, _ = await _open(direct.port, token)
            break
        except (InvalidStatus, OSError, ConnectionClosed):
            token, ended = await _grant(direct)
            await asyncio.sleep(0.1)
    assert (await _text_turn(client))["status"] in ("completed", "incomplete")
    await client.ws.close()


async def test_front_ends_that_lose_the_actor_drop_their_connections_without_a_close_frame(replica):
    """The actor gone (a killed replica): each front end exits at once, so the proxy sees a dropped connection
    and tells the client `replica_lost` (1012), not the 1011 an engine failure inside a live replica gives."""
    fronts, direct = replica
    token, _ = await _grant(direct)
    client, index = await _open(direct.port, token)
    proc = fronts.frontends.procs[index]
    fronts.frontends.request_stop()  # no restarts while the host vanishes
    fronts.host.close()
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await client.recv()
    assert closed.value.rcvd is None  # no close frame
    await _until(lambda: not proc.is_alive())


async def test_a_stop_lets_responses_in_progress_finish_then_closes_the_sessions_1001(replica):
    """What the replica's drain does (Serve stopping it): each front end drains as a single server on SIGTERM."""
    fronts, direct = replica
    token, ended = await _grant(direct)
    client, _ = await _open(direct.port, token)
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]})
    await client.send(type="response.create", response={"max_output_tokens": 40})
    await client.recv_until("response.created", timeout=60)
    stop = asyncio.ensure_future(fronts.stop())
    done = (await client.recv_until("response.done", timeout=60))[-1]["response"]
    assert done["status"] in ("completed", "incomplete")  # finished, not cancelled
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await client.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    assert await asyncio.wait_for(stop, 60) == 0
    assert await asyncio.wait_for(ended, 10) == "ended"
