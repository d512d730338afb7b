"""The cluster's direct data path without Ray: lease tokens on a real `websockets` port, the proxy's relay
against a real `websockets` server on loopback, and the middleware's admission through a lease call.

The "replica" here is a plain `websockets` server gated by the replica's own `LeaseGate` (what
`RealtimeServer(admit=...)` installs); the "client" is the ASGI side Serve's proxy hands the middleware.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

from realtime_ming.cluster.direct import DirectPort, bind_in_range
from realtime_ming.cluster.lease import (
    LEASE_HEADER,
    REPLICA_HEADER,
    LeaseBook,
    LeaseGate,
)
from realtime_ming.cluster.proxy import FULL_REASON, RealtimeProxyMiddleware
from realtime_ming.cluster.relay import LOST_REASON, UNREACHABLE_REASON, relay_direct
from realtime_ming.server.startup import StartupError

pytestmark = pytest.mark.timeout(60)


class Replica:
    """A loopback `websockets` server behind a `LeaseGate`: echoes messages; `script` can change that."""

    def __init__(self, ttl_s: float = 5.0) -> None:
        self.book = LeaseBook(ttl_s)
        self.gate = LeaseGate(self.book)
        self.requests: list = []
        self.closed_with: list[tuple[int | None, str | None]] = []
        self.connections: list = []
        self.script = None

    async def handler(self, ws) -> None:
        self.requests.append(ws.request)
        self.connections.append(ws)
        if self.script is not None:
            await self.script(ws)
            return
        try:
            async for message in ws:
                if message == "close-1001":
                    await ws.close(1001, "server shutting down")
                    return
                await ws.send(message)
        except ConnectionClosed:  # a close code other than 1000/1001
            pass
        finally:
            self.closed_with.append((ws.close_code, ws.close_reason))

    async def __aenter__(self) -> Replica:
        self.server = await serve(self.handler, "127.0.0.1", 0, process_request=self.gate.process_request,
                                  select_subprotocol=lambda _c, offered: offered[0] if offered else None)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"ws://127.0.0.1:{self.port}/v1/realtime"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    def grant(self, token: str) -> dict:
        return {"data_path": "direct", "host": "127.0.0.1", "port": self.port, "token": token, "replica": "r1"}


class AsgiClient:
    """The client side of an ASGI WebSocket: `inbox` feeds `receive`, `sent` collects what the app sends."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.sent: list[dict] = []
        self.changed = asyncio.Event()

    async def receive(self) -> dict:
        return await self.inbox.get()

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        self.changed.set()

    async def wait_for(self, kind: str, timeout: float = 10.0) -> dict:
        async with asyncio.timeout(timeout):
            while True:
                for message in self.sent:
                    if message["type"] == kind:
                        return message
                self.changed.clear()
                await self.changed.wait()


def _scope(query: bytes = b"", headers=(), subprotocols=("realtime",), extensions=None) -> dict:
    return {"type": "websocket", "path": "/v1/realtime", "query_string": query, "headers": list(headers),
            "subprotocols": list(subprotocols), "extensions": extensions or {}}


async def _ended():
    """A lease call's remainder that ends normally once the test lets it."""
    if False:
        yield None


# ---- lease tokens on the replica's port -------------------------------------------------------------

async def test_only_a_live_single_use_token_opens_the_direct_port():
    async with Replica(ttl_s=0.3) as replica:
        for headers in ([], [(LEASE_HEADER, "not-a-token")], [(LEASE_HEADER, "")]):
            with pytest.raises(InvalidStatus) as refused:
                await connect(replica.url, additional_headers=headers, open_timeout=5)
            assert refused.value.response.status_code == 403
        lease = replica.book.issue()
        other = replica.book.issue()
        # two lease headers are refused even when one is valid (and neither is used up)
        with pytest.raises(InvalidStatus):
            await connect(replica.url, additional_headers=[(LEASE_HEADER, lease.token), (LEASE_HEADER, "x")])
        ws = await connect(replica.url, additional_headers=[(LEASE_HEADER, lease.token)], open_timeout=5)
        await ws.send("hello")
        assert await ws.recv() == "hello"
        with pytest.raises(InvalidStatus) as reused:  # single use, even while the first session lives
            await connect(replica.url, additional_headers=[(LEASE_HEADER, lease.token)], open_timeout=5)
        assert reused.value.response.status_code == 403
        await ws.close()
        assert await asyncio.wait_for(lease.wait_done(), 5) is True  # ended by the connection's close
        await asyncio.sleep(0.35)  # `other` expired unused
        with pytest.raises(InvalidStatus):
            await connect(replica.url, additional_headers=[(LEASE_HEADER, other.token)], open_timeout=5)
        assert await asyncio.wait_for(other.wait_done(), 5) is False
        assert len(replica.book) == 0 and replica.gate.refused == 6


async def test_http_routes_of_the_direct_port_need_a_token_too():
    async with Replica() as replica:
        reader, writer = await asyncio.open_connection("127.0.0.1", replica.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        assert status.startswith(b"HTTP/1.1 403")


async def test_a_grant_stays_open_until_its_session_ends_and_tokens_are_distinct():
    port = DirectPort("127.0.0.1", None, 5.0)
    try:
        assert port.host == "127.0.0.1" and port.port > 0
        grants = port.grants("r1")
        grant = await anext(grants)
        assert grant["data_path"] == "direct" and grant["replica"] == "r1" and grant["port"] == port.port
        assert len(grant["token"]) >= 40  # 256 random bits, URL-safe
        second = await anext(port.grants("r1"))
        assert second["token"] != grant["token"]
        rest = asyncio.ensure_future(anext(grants))
        await asyncio.sleep(0.05)
        assert not rest.done()  # the Serve request stays ongoing while the lease lives
        lease = port.book.claim(grant["token"])
        lease.ended.set()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(rest, 5)
    finally:
        port.sock.close()


def _busy_port_before_a_free_one() -> socket.socket:
    """A listening socket whose port + 1 is free (the OS picks ports; retried until it gives such a pair)."""
    for _ in range(50):
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", taken.getsockname()[1] + 1))
                return taken
            except OSError:
                taken.close()
    raise AssertionError("no free port next to an OS-picked one in 50 tries")


def test_port_range_skips_ports_in_use():
    with _busy_port_before_a_free_one() as taken:
        busy = taken.getsockname()[1]
        with bind_in_range("127.0.0.1", (busy, busy + 1)) as sock:
            assert sock.getsockname()[1] == busy + 1
        with pytest.raises(StartupError, match="every port is in use"):
            bind_in_range("127.0.0.1", (busy, busy))


# ---- the relay --------------------------------------------------------------------------------------

async def _relayed(replica: Replica, scope: dict, lease_rest=None) -> tuple[AsgiClient, asyncio.Task]:
    client = AsgiClient()
    lease = replica.book.issue()
    task = asyncio.create_task(relay_direct(scope, client.receive, client.send, replica.grant(lease.token),
                                            lease_rest if lease_rest is not None else _ended(), open_timeout_s=5))
    return client, task


async def test_relay_forwards_the_handshake_and_both_kinds_of_message_both_ways():
    async with Replica() as replica:
        headers = [(b"authorization", b"Bearer k1"), (b"openai-beta", b"realtime=v1"), (b"origin", b"https://a.example"),
                   (b"cookie", b"secret"), (b"authorization", b"Bearer k2")]
        client, task = await _relayed(replica, _scope(b"model=gpt-realtime", headers, ("realtime", "openai-beta.realtime-v1")))
        accept = await client.wait_for("websocket.accept")
        assert accept["subprotocol"] == "realtime"
        assert (REPLICA_HEADER.encode(), b"r1") in accept["headers"]
        request = replica.requests[0]
        assert request.path == "/v1/realtime?model=gpt-realtime"
        assert request.headers.get_all("Authorization") == ["Bearer k1", "Bearer k2"]  # every value: ambiguity stays visible
        assert request.headers["OpenAI-Beta"] == "realtime=v1" and request.headers["Origin"] == "https://a.example"
        assert "Cookie" not in request.headers and LEASE_HEADER in request.headers
        await client.inbox.put({"type": "websocket.receive", "text": '{"type":"x"}'})
        await client.inbox.put({"type": "websocket.receive", "bytes": b"\x00\x01\xff"})
        async with asyncio.timeout(10):
            while len(echoed := [m for m in client.sent if m["type"] == "websocket.send"]) < 2:
                client.changed.clear()
                await client.changed.wait()
        await client.inbox.put({"type": "websocket.disconnect", "code": 4000})
        await asyncio.wait_for(task, 10)
        assert echoed == [{"type": "websocket.send", "text": '{"type":"x"}'},
                          {"type": "websocket.send", "bytes": b"\x00\x01\xff"}]
        assert replica.closed_with == [(4000, "")]  # the client's close code reached the replica


async def test_the_replicas_close_code_and_reason_reach_the_client():
    async with Replica() as replica:
        client, task = await _relayed(replica, _scope())
        await client.wait_for("websocket.accept")
        await client.inbox.put({"type": "websocket.receive", "text": "close-1001"})
        await asyncio.wait_for(task, 10)
        assert client.sent[-1] == {"type": "websocket.close", "code": 1001, "reason": "server shutting down"}


async def test_a_client_close_without_a_code_closes_the_replica_side_normally():
    async with Replica() as replica:
        client, task = await _relayed(replica, _scope())
        await client.wait_for("websocket.accept")
        await client.inbox.put({"type": "websocket.disconnect", "code": 1006})
        await asyncio.wait_for(task, 10)
        assert replica.closed_with == [(1000, "")]


async def test_a_dropped_replica_connection_is_replica_lost_1012():
    async with Replica() as replica:
        async def drops(ws):
            await ws.send('{"type":"session.created"}')
            ws.transport.abort()  # the process died: no close frame

        replica.script = drops
        client, task = await _relayed(replica, _scope())
        await asyncio.wait_for(task, 10)
        frames = [m for m in client.sent if m["type"] == "websocket.send"]
        assert frames[0]["text"] == '{"type":"session.created"}'
        error = json.loads(frames[-1]["text"])
        assert error["type"] == "error" and error["error"]["code"] == "replica_lost"
        assert client.sent[-1] == {"type": "websocket.close", "code": 1012, "reason": LOST_REASON}


async def test_a_failed_lease_call_is_replica_lost_even_while_the_socket_looks_open():
    async with Replica() as replica:
        hold = asyncio.Event()

        async def silent(ws):  # a node that vanished: no FIN, the socket just goes quiet
            await hold.wait()

        async def lease_fails():
            await asyncio.sleep(0.2)
            raise RuntimeError("ActorDiedError: the replica actor died")
            yield None

        replica.script = silent
        client, task = await _relayed(replica, _scope(), lease_fails())
        await asyncio.wait_for(task, 10)
        hold.set()
        assert json.loads(client.sent[-2]["text"])["error"]["code"] == "replica_lost"
        assert client.sent[-1]["code"] == 1012


async def test_a_refused_upgrade_is_answered_with_the_replicas_status():
    async with Replica() as replica:
        client = AsgiClient()
        grant = replica.grant("wrong")  # the replica answers 403
        await relay_direct(_scope(extensions={"websocket.http.response": {}}), client.receive, client.send, grant,
                           _ended(), open_timeout_s=5)
        assert client.sent[0]["type"] == "websocket.http.response.start" and client.sent[0]["status"] == 403
        assert client.sent[1]["type"] == "websocket.http.response.body"
        assert not any(m["type"] == "websocket.accept" for m in client.sent)


async def test_an_unreachable_replica_port_closes_1011_naming_the_cause():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        client = AsgiClient()
        await relay_direct(_scope(), client.receive, client.send,
                           {"host": "127.0.0.1", "port": port, "token": "t", "replica": "r1"}, _ended(), open_timeout_s=5)
    assert client.sent[-1] == {"type": "websocket.close", "code": 1011, "reason": UNREACHABLE_REASON}


# ---- the middleware's admission through the lease call -----------------------------------------------

class FakeLeaseCall:
    def __init__(self, grants: list[dict], delay_s: float = 0.0) -> None:
        self.grants, self.delay_s = list(grants), delay_s
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> dict:
        await asyncio.sleep(self.delay_s)
        if not self.grants:
            raise StopAsyncIteration
        return self.grants.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


async def _through_middleware(call: FakeLeaseCall, app=None, wait_s: float = 0.2) -> AsgiClient:
    async def opens():
        return call

    async def no_app(scope, receive, send):
        raise AssertionError("the session must not go through Serve")

    client = AsgiClient()
    await client.inbox.put({"type": "websocket.connect"})
    await client.inbox.put({"type": "websocket.disconnect", "code": 1000})
    await RealtimeProxyMiddleware(app or no_app, admission_wait_s=wait_s, leases=opens)(_scope(), client.receive, client.send)
    return client


async def test_no_lease_within_the_admission_wait_is_refused_like_a_full_server():
    call = FakeLeaseCall([{"data_path": "direct"}], delay_s=5)
    client = await _through_middleware(call)
    assert client.sent == [{"type": "websocket.accept", "subprotocol": "realtime"},
                           {"type": "websocket.close", "code": 1013, "reason": FULL_REASON}]
    assert call.cancelled  # the queued lease request is withdrawn


async def test_a_direct_grant_is_relayed_to_the_replica():
    async with Replica() as replica:
        lease = replica.book.issue()
        call = FakeLeaseCall([replica.grant(lease.token)])
        client = await _through_middleware(call)
        assert client.sent[0]["type"] == "websocket.accept" and (REPLICA_HEADER.encode(), b"r1") in client.sent[0]["headers"]
        assert replica.closed_with == [(1000, "")]
        assert not call.cancelled  # the lease call ended with the session


async def test_an_unreachable_grant_cancels_its_lease_call():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        call = FakeLeaseCall([{"data_path": "direct", "host": "127.0.0.1", "port": s.getsockname()[1], "token": "t",
                               "replica": "r1"}, {"never": "ends"}], delay_s=0.0)
        client = await _through_middleware(call)
    assert client.sent[-1]["code"] == 1011 and call.cancelled  # the replica's slot is freed at once


async def test_replicas_on_the_serve_data_path_get_the_session_through_serve():
    seen = []

    async def serve_app(scope, receive, send):
        seen.append(await receive())  # the connect message the middleware already read is handed on
        await send({"type": "websocket.accept", "subprotocol": "realtime"})
        await send({"type": "websocket.close", "code": 1000, "reason": ""})

    client = await _through_middleware(FakeLeaseCall([{"data_path": "serve", "replica": "r1"}]), serve_app)
    assert seen == [{"type": "websocket.connect"}]
    assert [m["type"] for m in client.sent] == ["websocket.accept", "websocket.close"]


async def test_a_lease_call_that_fails_before_granting_is_refused_1013():
    client = await _through_middleware(FakeLeaseCall([]))
    assert client.sent[-1] == {"type": "websocket.close", "code": 1013, "reason": FULL_REASON}



async def test_a_slow_client_pushes_back_to_the_replica_instead_of_filling_the_proxy():
    """The proxy buffers a bounded number of the replica's messages: while the client does not take them,
    the replica's sends stall (TCP pushes back, as to a slow client of a single server); nothing is lost."""
    count, size = 400, 64 * 1024  # 25 MiB: far more than loopback socket buffers plus the relay's queue
    sent_all = asyncio.Event()

    async def flood(ws) -> None:
        for i in range(count):
            await ws.send(bytes([i % 256]) * size)
        sent_all.set()
        await ws.wait_closed()

    async with Replica() as replica:
        replica.script = flood
        client = AsgiClient()
        gate = asyncio.Event()
        fast_send = client.send

        async def slow_send(message: dict) -> None:
            if message["type"] == "websocket.send":
                await gate.wait()  # the client reads nothing until the test opens the gate
            await fast_send(message)

        client.send = slow_send
        lease = replica.book.issue()
        task = asyncio.create_task(relay_direct(_scope(), client.receive, client.send, replica.grant(lease.token),
                                                _ended(), open_timeout_s=5))
        await client.wait_for("websocket.accept")
        await asyncio.sleep(1.0)
        assert not sent_all.is_set(), "the proxy read the replica's whole output for a client that reads nothing"
        gate.set()
        await asyncio.wait_for(sent_all.wait(), 30)
        async with asyncio.timeout(30):
            while len([m for m in client.sent if m["type"] == "websocket.send"]) < count:
                client.changed.clear()
                await client.changed.wait()
        payloads = [m["bytes"] for m in client.sent if m["type"] == "websocket.send"]
        assert [p[0] for p in payloads] == [i % 256 for i in range(count)] and all(len(p) == size for p in payloads)
        await client.inbox.put({"type": "websocket.disconnect", "code": 1000})
        await asyncio.wait_for(task, 10)
