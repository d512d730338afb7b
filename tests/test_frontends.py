"""`server.frontend_processes`: the engine host and its remote engines, and the connection hand-off.

The host / remote pair runs over a real unix socket (`multiprocessing.connection`) against a scripted
engine; the dispatcher hands real loopback connections to front-end channels. The multi-process server end to end
(`realtime-ming serve` with two front-end processes): tests/test_frontends_served.py.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time

import numpy as np
import pytest
from server_support import StubEngine, WsClient, http_request
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from realtime_ming.engine.api import (
    AudioChunk,
    Content,
    EngineHealth,
    FailureCode,
    FinishReason,
    Message,
    TextDelta,
    TurnDone,
    TurnFailed,
    TurnRequest,
)
from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer, load_config
from realtime_ming.server.app import FRONTEND_HEADER
from realtime_ming.server.config import VoicesConfig
from realtime_ming.server.engine_host import EngineHost
from realtime_ming.server.remote_engine import RemoteEngine

pytestmark = pytest.mark.timeout(120)


class ScriptEngine:
    """Records commands; `emit` plays events into a turn's sink from another thread, as an engine thread does."""

    def __init__(self) -> None:
        self.sinks: dict = {}
        self.commands: list[tuple] = []
        self.alive = EngineHealth(True)
        self.changed = threading.Condition()

    def _record(self, *command) -> None:
        with self.changed:
            self.commands.append(command)
            self.changed.notify_all()

    def submit(self, request, sink) -> None:
        self.sinks[request.turn_id] = sink
        self._record("submit", request.turn_id, request.conversation_id)

    def confirm(self, turn_id): self._record("confirm", turn_id)
    def discard(self, turn_id): self._record("discard", turn_id)
    def cancel(self, turn_id): self._record("cancel", turn_id)
    def close_conversation(self, conversation_id): self._record("close", conversation_id)
    def health(self): return self.alive
    def info(self): return {"model": "script", "device": "cpu"}
    def voices(self): return ["DB30"]

    def wait_for(self, command: tuple, timeout: float = 5.0) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: command in self.commands, timeout), (command, self.commands)

    def emit(self, turn_id: str, events) -> None:
        thread = threading.Thread(target=lambda: [self.sinks[turn_id](e) for e in events])
        thread.start()
        thread.join()


class CountingConn:
    """A connection that counts the messages it receives (the host's batches)."""

    def __init__(self, conn) -> None:
        self.conn, self.received = conn, 0

    def recv(self):
        message = self.conn.recv()
        self.received += 1
        return message

    def send(self, message) -> None:
        self.conn.send(message)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def hosted(tmp_path):
    engine = ScriptEngine()
    authkey = secrets.token_bytes(16)
    host = EngineHost(engine, str(tmp_path / "engine.sock"), authkey, VoicesConfig(), max_sessions=2)
    host.start()
    remotes = []

    def remote(counting: bool = False) -> RemoteEngine:
        from multiprocessing.connection import Client

        conn = Client(host.address, family="AF_UNIX", authkey=authkey)
        made = RemoteEngine(CountingConn(conn) if counting else conn)
        remotes.append(made)
        return made

    yield engine, host, remote
    for made in remotes:
        made.close()
    host.close()


def _request(turn_id: str, conversation: str = "c1", speculative: bool = False) -> TurnRequest:
    return TurnRequest(turn_id, conversation, (Message("user", (Content.of_text("hi"),)),), speculative=speculative)


def _done(turn_id: str) -> TurnDone:
    return TurnDone(turn_id, "", FinishReason.STOP, 1, 0, 1, 0, {})


def _collector():
    got, done = [], threading.Event()

    def sink(event) -> None:
        got.append(event)
        if isinstance(event, (TurnDone, TurnFailed)):
            done.set()

    return got, done, sink


class _CharMeter:
    """A `PromptMeter` that counts characters: what the host answers is visible in the numbers."""

    max_seq_len, caption_budget = 100, 10

    def system_tokens(self, system, tools) -> int:
        return len(system or "") + sum(len(json.dumps(t)) for t in tools)

    def caption_tokens(self, caption: str) -> int:
        return len(caption)


class MeteredEngine(ScriptEngine):
    def info(self): return {**super().info(), "prompt": {"max_seq_len": 100, "caption_budget": 10}}
    def prompt_meter(self): return _CharMeter()


def test_a_front_end_measures_prompts_with_the_engine_process_meter(tmp_path):
    """RemoteEngine.prompt_meter() asks the engine process (its tokenizers): the same counts and budgets; an engine
    without a meter gives None (the session then leaves the budgets to the engine's turn-time checks)."""
    authkey = secrets.token_bytes(16)
    for engine, expect_meter in ((MeteredEngine(), True), (ScriptEngine(), False)):
        host = EngineHost(engine, str(tmp_path / f"{expect_meter}.sock"), authkey, VoicesConfig(), max_sessions=2)
        host.start()
        remote = RemoteEngine.connect(host.address, authkey)
        try:
            meter = remote.prompt_meter()
            assert (meter is not None) == expect_meter
            if meter is not None:
                tool = {"type": "function", "function": {"name": "f"}}
                assert (meter.max_seq_len, meter.caption_budget) == (100, 10)
                assert meter.system_tokens("Be brief.", (tool,)) == 9 + len(json.dumps(tool))
                assert meter.caption_tokens("快速") == 2
        finally:
            remote.close()
            host.close()


def test_events_keep_their_turn_order_and_travel_in_batches(hosted):
    engine, _, remote = hosted
    front = remote(counting=True)
    a, a_done, a_sink = _collector()
    b, b_done, b_sink = _collector()
    front.submit(_request("a"), a_sink)
    front.submit(_request("b", "c2"), b_sink)
    engine.wait_for(("submit", "b", "c2"))
    before = front._conn.received
    pcm = np.linspace(-1, 1, 441, dtype=np.float32)
    interleaved = []
    for i in range(200):
        interleaved += [TextDelta("a", f"a{i}"), AudioChunk("b", pcm, segment_id=i)]
    thread = threading.Thread(target=lambda: [engine.sinks[e.turn_id](e) for e in interleaved])
    thread.start()
    thread.join()
    engine.emit("a", [_done("a")])
    engine.emit("b", [_done("b")])
    assert a_done.wait(5) and b_done.wait(5)
    assert [e.text for e in a[:-1]] == [f"a{i}" for i in range(200)] and isinstance(a[-1], TurnDone)
    assert [e.segment_id for e in b[:-1]] == list(range(200)) and isinstance(b[-1], TurnDone)
    np.testing.assert_array_equal(b[0].pcm, pcm)
    assert front._conn.received - before < 402 // 4, "events were not batched"


def test_unknown_turns_cancel_quietly_and_a_failing_sink_costs_only_its_own_events(hosted):
    engine, _, remote = hosted
    front = remote()
    front.cancel("never-submitted")
    engine.wait_for(("cancel", "never-submitted"))

    def broken(event) -> None:
        raise RuntimeError("sink bug")

    good, good_done, good_sink = _collector()
    front.submit(_request("bad"), broken)
    front.submit(_request("good", "c2"), good_sink)
    engine.wait_for(("submit", "good", "c2"))
    engine.emit("bad", [TextDelta("bad", "x"), _done("bad")])
    engine.emit("good", [TextDelta("good", "y"), _done("good")])
    assert good_done.wait(5)
    assert [type(e) for e in good] == [TextDelta, TurnDone]
    assert front.health().alive


def test_a_front_end_that_hangs_up_leaves_no_turn_or_conversation(hosted):
    engine, _host, remote = hosted
    front = remote()
    _, _, sink = _collector()
    front.submit(_request("live"), sink)
    front.submit(_request("spec", "c2", speculative=True), sink)
    front.submit(_request("done", "c3"), sink)
    engine.wait_for(("submit", "done", "c3"))
    engine.emit("done", [_done("done")])
    time.sleep(0.2)
    front.close()
    for command in (("cancel", "live"), ("discard", "spec"), ("close", "c1"), ("close", "c2"), ("close", "c3")):
        engine.wait_for(command)
    assert ("cancel", "done") not in engine.commands


def test_global_session_tickets_and_release_when_a_front_end_goes(hosted):
    _, host, remote = hosted
    one, two = remote(), remote()

    async def scenario() -> None:
        first, second = one.session_tickets(), two.session_tickets()
        assert await first.acquire() and await second.acquire()
        assert not await second.acquire() and not await first.acquire()  # max_sessions=2 across both
        first.release()
        await asyncio.sleep(0.1)
        assert await second.acquire()
        two.close()  # holds 2 tickets; they come back with its connection
        deadline = time.monotonic() + 5
        while host.status().sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert host.status().sessions == 0
        assert await first.acquire()

    asyncio.run(scenario())


def test_dead_engine_reaches_the_front_end_and_fails_its_turns(hosted):
    engine, host, remote = hosted
    front = remote()
    got, done, sink = _collector()
    front.submit(_request("t"), sink)
    engine.wait_for(("submit", "t", "c1"))
    engine.alive = EngineHealth(False, "engine thread died")
    deadline = time.monotonic() + 1.0
    while front.health().alive and time.monotonic() < deadline:
        time.sleep(0.02)
    assert front.health() == EngineHealth(False, "engine thread died")
    host.close()  # the engine process goes away: its open turns fail at once
    assert done.wait(2)
    assert isinstance(got[-1], TurnFailed) and got[-1].code is FailureCode.ENGINE_UNAVAILABLE
    late, late_done, late_sink = _collector()
    front.submit(_request("after"), late_sink)
    assert late_done.is_set() and late[0].code is FailureCode.ENGINE_UNAVAILABLE


async def test_a_server_on_a_remote_engine_serves_validated_turns(tmp_path):
    """RealtimeServer on a RemoteEngine (one process, the host on a thread): frames validate, health shows the front end."""
    stub = StubEngine()
    authkey = secrets.token_bytes(16)
    host = EngineHost(stub, str(tmp_path / "e.sock"), authkey, VoicesConfig(), max_sessions=1)
    host.start()
    front = await asyncio.to_thread(RemoteEngine.connect, host.address, authkey)
    cfg = load_config(None, ["server.port=0"])
    try:
        async with RealtimeServer(cfg, front, tickets=front.session_tickets(), frontend=3) as srv:
            client = WsClient(await connect(f"ws://127.0.0.1:{srv.port}/v1/realtime"), Dialect.GA)
            assert client.ws.response.headers[FRONTEND_HEADER] == "3"
            assert (await client.recv())["type"] == "session.created"
            with pytest.raises(ConnectionClosed) as refused:  # max_sessions=1 held by the host
                extra = await connect(f"ws://127.0.0.1:{srv.port}/v1/realtime")
                await extra.recv()
            assert refused.value.rcvd.code == CloseCode.TRY_AGAIN_LATER
            await client.send(type="conversation.item.create", item={
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
            await client.send(type="response.create")
            frames = await client.recv_until("response.done", timeout=20)
            assert frames[-1]["response"]["status"] == "completed", frames[-1]
            assert any(f["type"] == "response.output_audio.delta" for f in frames)
            status, _, body = await http_request(srv.port, "/health")
            assert status == 200 and json.loads(body)["frontend"]["index"] == 3
            await client.ws.close()
    finally:
        front.close()
        host.close()
        stub.close()


# ---- connection hand-off: the engine process accepts, the least-loaded front end serves ----------------

def _handed(channel, timeout: float = 5.0):
    """The one connection waiting on a front end's end of a hand-off channel, as a socket."""
    import socket

    channel.settimeout(timeout)
    _, fds, _, _ = socket.recv_fds(channel, 16, 1)
    assert len(fds) == 1
    return socket.socket(fileno=fds[0])


def test_dispatcher_spreads_by_open_connections_and_rehands_what_a_dead_front_end_never_received():
    import socket

    from realtime_ming.server.handoff import _CLOSED, _RECEIVED, _REPORT, Dispatcher
    from realtime_ming.server.startup import open_listener

    listener = open_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    dispatcher = Dispatcher(listener, 2)
    ends = [dispatcher.new_channel(0), dispatcher.new_channel(1)]
    clients = []
    try:
        clients.append(socket.create_connection(("127.0.0.1", port)))
        dispatcher.run_for(0.2)
        assert dispatcher.handed == [0, 0], "a connection went to a front end that is not ready"
        for i in (0, 1):
            dispatcher.mark_ready(i)
        clients += [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        deadline = time.monotonic() + 5
        while sum(dispatcher.handed) < 4 and time.monotonic() < deadline:
            dispatcher.run_for(0.05)
        assert sorted(dispatcher.handed) == [2, 2] and dispatcher.open == [2, 2]
        ends[0].send(_REPORT.pack(_RECEIVED, 2))  # front end 0 took both, and one of them closed
        ends[0].send(_REPORT.pack(_CLOSED, 1))
        dispatcher.run_for(0.1)
        assert dispatcher.open == [1, 2]
        clients.append(socket.create_connection(("127.0.0.1", port)))
        while sum(dispatcher.handed) < 5 and time.monotonic() < deadline:
            dispatcher.run_for(0.05)
        assert dispatcher.handed == [3, 2], "the next connection did not go to the least-loaded front end"
        # front end 1 dies without receiving its two: they go to front end 0, still the clients' connections
        ends[1].close()
        dispatcher.run_for(0.1)
        assert not dispatcher.ready[1] and dispatcher.handed == [5, 2]
        got = [_handed(ends[0]) for _ in range(5)]  # its 3, then front end 1's 2: every client's connection
        for conn in got:
            conn.sendall(b"still yours")
        for client in clients:
            client.settimeout(5)
            assert client.recv(32) == b"still yours"
        for conn in got:
            conn.close()
    finally:
        for sock in (*clients, *ends):
            sock.close()
        dispatcher.close()
        listener.close()


def test_client_secrets_live_in_the_engine_process_for_every_front_end(hosted):
    """An ephemeral key minted through one front end is redeemed through another, once; revoked through either."""
    from realtime_ming.server.client_secrets import SecretsFull

    _engine, _host, remote = hosted
    a, b = remote().client_secrets(), remote().client_secrets()
    value, expires_at = a.mint("key-a", {"instructions": "hi"}, 60)
    assert expires_at > time.time()
    assert b.peek(value).owner == "key-a"
    assert b.redeem(value).session == {"instructions": "hi"}
    assert a.redeem(value) is None and b.peek(value) is None  # single use, whichever front end saw it
    other, _ = b.mint("key-a", {}, 60)
    assert not a.revoke("key-b", other) and a.revoke("key-a", other) and b.redeem(other) is None
    assert a.revoke_all("key-a") == 0
    with pytest.raises(RuntimeError, match="no client-secret call"):
        a._call("_drop", other)
    assert SecretsFull  # the host's refusal of a full store reaches the front end as this type (see test_webrtc_units)
