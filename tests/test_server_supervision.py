"""Server supervision on loopback: health probes, engine faults seen by clients, graceful drain, exit codes.

Real sockets and raw clients whose every frame is validated against the openai package's event types.
Engine faults are injected into a real engine (embedded tiny model, CPU); the drain runs on the scripted
StubEngine; the CLI tests run `python -m realtime_ming.cli serve` and watch its exit code.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

import pytest
from conftest import fresh_engine_fixture
from served_cli_support import ServedCli, cli_env, served_cli
from server_support import StubEngine, WsClient, http_request, seconds
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer, load_config

pytestmark = pytest.mark.timeout(180)


class ThreadKiller(BaseException):
    """Kills the engine thread (not an Exception)."""


engine = fresh_engine_fixture()


def _config(*overrides: str):
    return load_config(None, ["server.port=0", *overrides])


async def _open(port: int) -> WsClient:
    client = WsClient(await connect(f"ws://127.0.0.1:{port}/v1/realtime"), Dialect.GA)
    assert (await client.recv())["type"] == "session.created"
    return client


async def _respond(client: WsClient, text: str, max_tokens: int | str = 8, **response) -> None:
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await client.send(type="response.create", response={"output_modalities": ["text"],
                                                        "max_output_tokens": max_tokens, **response})


async def _done(client: WsClient, timeout: float = 60.0) -> dict:
    return (await client.recv_until("response.done", timeout=timeout))[-1]["response"]


async def _health(port: int, path: str) -> tuple[int, dict]:
    status, _, body = await http_request(port, path)
    return status, json.loads(body)


def _failed_with(response: dict, code: str) -> None:
    assert response["status"] == "failed", response
    assert response["status_details"]["error"]["code"] == code, response["status_details"]


async def test_health_probes_of_a_serving_server():
    """Alive and below max_sessions: /health, /health/live and /health/ready are 200; at the limit ready is 503."""
    engine = StubEngine()
    async with RealtimeServer(_config("server.limits.max_sessions=1"), engine) as srv:
        for path in ("/health", "/health/live", "/health/ready"):
            status, body = await _health(srv.port, path)
            assert status == 200 and body["engine"] == {"alive": True, "reason": None}, (path, body)
        client = await _open(srv.port)
        status, body = await _health(srv.port, "/health/ready")
        assert (status, body["status"], body["reason"]) == (503, "not_ready", "at max_sessions")
        assert (await _health(srv.port, "/health"))[0] == 200
        await client.ws.close()
    engine.close()


async def test_admission_fault_fails_one_response_with_its_code(engine, monkeypatch):
    """A TypeError while admitting one session's turn: that response.done is failed/engine_admission_failed,
    another session's response in progress completes, the next response of the faulty session completes."""
    admit, fired = engine._thinker.admit, []

    def faulty(request, *args, **kwargs):  # the first turn whose conversation mentions "boom" (once: its item
        # stays in history); admit's other arguments (the prepared inputs) pass through unchanged
        if not fired and any("boom" in (c.text or "") for m in request.history for c in m.content):
            fired.append(request.turn_id)
            raise TypeError("injected admission fault")
        return admit(request, *args, **kwargs)

    monkeypatch.setattr(engine._thinker, "admit", faulty)
    async with RealtimeServer(_config(), engine) as srv:
        healthy, faulty_client = await _open(srv.port), await _open(srv.port)
        await _respond(healthy, "Tell me a story", max_tokens=60)
        await healthy.recv_until("response.output_text.delta")
        await _respond(faulty_client, "boom")
        _failed_with(await _done(faulty_client), "engine_admission_failed")
        assert (await _done(healthy))["status"] == "incomplete"  # ran to max_output_tokens
        await _respond(faulty_client, "hello again")
        assert (await _done(faulty_client))["status"] == "incomplete"
        assert (await _health(srv.port, "/health"))[0] == 200
        for client in (healthy, faulty_client):
            await client.ws.close()


async def test_engine_death_is_visible_and_nothing_hangs(engine, monkeypatch):
    """The engine thread killed mid-response: the in-flight response.done is failed/engine_unavailable,
    /health and /health/live turn 503 within 1 s, and a new session's response fails at once."""
    async with RealtimeServer(_config(), engine) as srv:
        client = await _open(srv.port)
        await _respond(client, "Tell me a long story", max_tokens=4096)
        await client.recv_until("response.output_text.delta", timeout=30)
        launch, armed = engine._thinker.launch, threading.Event()

        def killing(*args, **kwargs):
            if not armed.is_set():
                armed.set()
                raise ThreadKiller("injected engine death")
            return launch(*args, **kwargs)

        monkeypatch.setattr(engine._thinker, "launch", killing)
        killed = await asyncio.to_thread(armed.wait, 10)
        assert killed
        t0 = time.monotonic()
        while (await _health(srv.port, "/health"))[0] != 503:
            assert time.monotonic() - t0 < seconds(30), "/health still 200 after the engine died"
            await asyncio.sleep(0.02)
        status, body = await _health(srv.port, "/health")
        assert body["status"] == "unavailable" and "ThreadKiller" in body["engine"]["reason"]
        assert (await _health(srv.port, "/health/live"))[0] == 503
        status, ready = await _health(srv.port, "/health/ready")
        assert (status, ready["reason"]) == (503, "engine unavailable")
        _failed_with(await _done(client, timeout=5), "engine_unavailable")
        newcomer = await _open(srv.port)
        await _respond(newcomer, "hello")
        _failed_with(await _done(newcomer, timeout=5), "engine_unavailable")
        for c in (client, newcomer):
            await c.ws.close()


async def test_drain_finishes_replies_refuses_new_work_then_closes_1001():
    """begin_drain with a reply in progress: /health 503 draining, ready 503, live 200; a new session gets 1013,
    a new response in an open session fails with server_shutting_down; the reply in progress completes; then
    the sessions close with 1001."""
    engine = StubEngine(words=("word ",) * 40, step_s=0.03)  # a ~1.2 s reply
    async with RealtimeServer(_config(), engine) as srv:
        talking, idle = await _open(srv.port), await _open(srv.port)
        await _respond(talking, "hi")
        await talking.recv_until("response.output_text.delta")
        srv.begin_drain()
        status, body = await _health(srv.port, "/health")
        assert (status, body["status"], body["draining"]) == (503, "draining", True)
        assert (await _health(srv.port, "/health/ready"))[1]["reason"] == "draining"
        assert (await _health(srv.port, "/health/live"))[0] == 200
        late = await connect(f"ws://127.0.0.1:{srv.port}/v1/realtime")
        with pytest.raises(ConnectionClosed) as refused:
            await asyncio.wait_for(late.recv(), seconds(5))
        assert refused.value.rcvd.code == CloseCode.TRY_AGAIN_LATER
        await _respond(idle, "hello")
        _failed_with(await _done(idle, timeout=5), "server_shutting_down")
        assert await srv.wait_responses_done(seconds(10))
        assert (await _done(talking, timeout=1))["status"] == "completed"
        await srv.close()
        for client in (talking, idle):
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(client.ws.recv(), seconds(5))
            assert closed.value.rcvd.code == CloseCode.GOING_AWAY
    engine.close()


async def test_drain_deadline_ends_every_running_response_before_the_close():
    """Replies still running when the drain gives up: each (default conversation and out of band) gets its
    .done events and response.done (cancelled, error server_shutting_down) before the 1001 close frame."""
    engine = StubEngine(words=("word ",) * 400, step_s=0.05)  # a 20 s reply
    async with RealtimeServer(_config(), engine) as srv:
        clients = [await _open(srv.port) for _ in range(2)]
        await _respond(clients[0], "hi", max_tokens="inf")
        await _respond(clients[1], "hi", max_tokens="inf", conversation="none")
        for client in clients:
            await client.recv_until("response.output_text.delta")
        srv.begin_drain()
        assert not await srv.wait_responses_done(0.2)  # the deadline passes with both replies running
        await srv.close()
        for client in clients:
            frames = await client.recv_until("response.done", timeout=5)
            assert {"response.output_text.done", "response.output_item.done"} <= {f["type"] for f in frames}
            response = frames[-1]["response"]
            assert response["status"] == "cancelled", response
            assert response["status_details"]["error"]["code"] == "server_shutting_down", response
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(client.ws.recv(), seconds(5))
            assert closed.value.rcvd.code == CloseCode.GOING_AWAY  # the next frame after response.done: the close
    engine.close()


async def test_shutdown_as_a_session_ends_waits_for_nothing_that_never_answers(monkeypatch, caplog):
    """Issue 43: a session whose reader has just ended (its client went away) while the server shuts down: the
    shutdown's request to end its responses must not wait on a session task that will never run again (it
    waited out the whole shutdown timeout and logged the session as left open, as seen at the end of bench.fuzz)."""
    from realtime_ming.server import connection

    engine = StubEngine()
    async with RealtimeServer(_config(), engine) as srv:
        read, late = connection._read, []

        async def read_then_shutdown(*args, **kwargs):  # the shutdown arrives as the reader ends
            try:
                await read(*args, **kwargs)
            finally:
                late.append(asyncio.ensure_future(srv._live.end_all(CloseCode.GOING_AWAY, "shutdown", 60.0)))

        monkeypatch.setattr(connection, "_read", read_then_shutdown)
        client = await _open(srv.port)
        await client.ws.close()
        while not late:
            await asyncio.sleep(0.01)
        assert await late[0] == 0  # every session ended in time (the one gone among them)
        with caplog.at_level("WARNING"):
            await srv.close()
        assert not [r for r in caplog.records if "still open" in r.getMessage()]
    engine.close()


# ---- the CLI process ------------------------------------------------------------------------------


_FORCED_STORY = "Once upon a time a small robot learned to sing, and every evening it sang to the sea. "


@pytest.mark.slow  # the full tier: the CLI in a server process
def test_cli_exits_nonzero_when_the_engine_dies():
    """With the documented fault injection on, a turn carrying the kill marker kills the engine: another
    session's reply in progress ends failed/engine_unavailable and the process exits 70 within seconds."""
    from realtime_ming.engine.supervision import FAULT_INJECTION_ENV, KILL_ENGINE_MARKER
    from realtime_ming.server.run import EXIT_ENGINE_DIED

    async def scenario(port: int) -> dict:
        talking, killer = await _open(port), await _open(port)
        await _respond(talking, "Tell me a long story", max_tokens=4096)
        await talking.recv_until("response.output_text.delta", timeout=30)
        await _respond(killer, "hi", instructions=f"be brief {KILL_ENGINE_MARKER}")
        return await _done(talking, timeout=10)

    with served_cli(env=cli_env({FAULT_INJECTION_ENV: "1"})) as server:
        response = asyncio.run(scenario(server.port))
        _failed_with(response, "engine_unavailable")
        died_at = time.monotonic()
        assert server.wait_exit(20) == EXIT_ENGINE_DIED  # serving stops at once; interpreter teardown takes seconds
        assert time.monotonic() - died_at < seconds(20)


@pytest.mark.slow
def test_cli_sigterm_lets_the_reply_finish_then_exits_zero():
    """SIGTERM mid-reply: the reply generates to its end (all its max_output_tokens, response.done incomplete /
    max_output_tokens), the session closes with 1001, exit 0. The thinker plays a forced reply with no end token
    (cycled; every model stage still runs): the random-weight model's own tokens may end the reply early or
    write function-call markup (a failed response), which says nothing about the drain."""
    max_tokens = 200

    async def scenario(server: ServedCli) -> tuple[dict, int]:
        client = await _open(server.port)
        await _respond(client, "Tell me a story", max_tokens=max_tokens)
        await client.recv_until("response.output_text.delta", timeout=30)
        server.proc.send_signal(signal.SIGTERM)
        after = await client.recv_until("response.done", timeout=30)
        assert any(e["type"] == "response.output_text.delta" for e in after)  # the reply went on after the signal
        response = after[-1]["response"]
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(client.ws.recv(), seconds(10))
        return response, closed.value.rcvd.code

    with served_cli("--hook", f"forced_reply={_FORCED_STORY}") as server:
        response, code = asyncio.run(scenario(server))
        assert response["status"] == "incomplete", response  # generated to its end, not cut off
        assert response["status_details"]["reason"] == "max_output_tokens"
        assert response["usage"]["output_token_details"]["text_tokens"] == max_tokens
        assert code == CloseCode.GOING_AWAY
        assert server.wait_exit(30) == 0


def test_every_engine_failure_cause_has_its_own_response_code():
    """Each FailureCode maps to a distinct error code of the published list; only invalid_prompt (the client's
    own content) carries the engine's detail, with the client-error type."""
    from realtime_ming.engine.api import FailureCode, TurnFailed
    from realtime_ming.protocol.error_codes import ErrorCode
    from realtime_ming.session.response import failure_error

    results = {cause: failure_error("resp_1", TurnFailed("resp_1", "prompt of 900 tokens is too long", cause))
               for cause in FailureCode}
    details = {cause: detail for cause, (detail, _) in results.items()}
    transient = {cause for cause, (_, is_transient) in results.items() if is_transient}
    assert transient == {FailureCode.ENGINE_BUSY, FailureCode.ENGINE_UNAVAILABLE, FailureCode.SHUTTING_DOWN}
    codes = {cause: detail.code for cause, detail in details.items()}
    assert len(set(codes.values())) == len(FailureCode)
    assert all(ErrorCode(code) for code in codes.values())
    assert codes[FailureCode.ENGINE_UNAVAILABLE] == "engine_unavailable"
    invalid = details[FailureCode.INVALID_PROMPT]
    assert invalid.type == "invalid_request_error" and "prompt of 900 tokens is too long" in invalid.message
    assert all("900" not in d.message for c, d in details.items() if c not in (FailureCode.INVALID_PROMPT, FailureCode.CONTEXT_LENGTH_EXCEEDED))
