"""The server over real loopback sockets with a scripted engine: HTTP endpoints, handshake, auth,
limits, and the error events of bad client input (each non-fatal: the session keeps serving).

The engine here is `server_support.StubEngine` (model output is not under test); the spoken
turns with the real tiny model are in test_server_realtime.py. Every server frame is validated
against the openai SDK's union for its dialect.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from server_support import StubEngine, WsClient, http_request, pcm16_b64, seconds, tone
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import CloseCode

from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer, load_config
from realtime_ming.server.frame_parser import limits_parser


@pytest.fixture
def web_dir(tmp_path):
    web = tmp_path / "web"
    web.mkdir()
    (web / "index.html").write_text("<!doctype html><title>demo</title>")
    (web / "app.js").write_text("export const x = 1;\n")
    (tmp_path / "secret.txt").write_text("do not serve")
    return web


@pytest.fixture
def engine():
    stub = StubEngine()
    yield stub
    stub.close()


def _config(web_dir, *overrides: str):
    return load_config(None, ["server.port=0", f"server.web_dir={web_dir}", "session.vad.enabled=false", *overrides])


@pytest.fixture
async def server(engine, web_dir):
    async with RealtimeServer(_config(web_dir), engine) as srv:
        yield srv


def _url(srv: RealtimeServer, query: str = "?model=ming") -> str:
    return f"ws://127.0.0.1:{srv.port}/v1/realtime{query}"


async def _open(srv: RealtimeServer, dialect: Dialect = Dialect.GA, **kwargs) -> WsClient:
    ws = await connect(_url(srv), **kwargs)
    client = WsClient(ws, dialect)
    assert (await client.recv())["type"] == "session.created"
    return client


async def _still_serving(client: WsClient) -> None:
    await client.send(type="session.update", session={"type": "realtime", "instructions": "ok"})
    assert (await client.recv())["type"] == "session.updated"


# ---- HTTP -----------------------------------------------------------------------------------


async def test_health_reports_model_and_sessions(server):
    """GET /health: status, model, device and the live session count."""
    status, headers, body = await http_request(server.port, "/health")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"status": "ok", "model": "stub-ming", "device": "cpu", "sessions": 0,
                                "max_sessions": 32, "draining": False, "engine": {"alive": True, "reason": None}}
    client = await _open(server)
    _, _, body = await http_request(server.port, "/health")
    assert json.loads(body)["sessions"] == 1
    await client.ws.close()


async def test_head_has_headers_without_body(server):
    """HEAD /health: same Content-Length as GET, empty body."""
    _, get_headers, get_body = await http_request(server.port, "/health")
    status, headers, body = await http_request(server.port, "/health", method="HEAD")
    assert status == 200 and body == b""
    assert headers["content-length"] == get_headers["content-length"] == str(len(get_body))


async def test_models_lists_the_model(server):
    """GET /v1/models: OpenAI list shape with our model id and device."""
    status, _, body = await http_request(server.port, "/v1/models")
    models = json.loads(body)
    assert status == 200 and models["object"] == "list"
    (entry,) = models["data"]
    assert (entry["id"], entry["object"], entry["device"]) == ("stub-ming", "model", "cpu")


async def test_metrics_count_sessions_and_errors(server):
    """GET /metrics: Prometheus text with the session counter and errors by code."""
    client = await _open(server)
    await client.ws.send("{not json")
    await client.expect_error("invalid_json")
    status, headers, body = await http_request(server.port, "/metrics")
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert "realtime_ming_sessions 1.0" in text
    assert "realtime_ming_sessions_accepted_total 1.0" in text
    assert 'realtime_ming_errors_total{code="invalid_json"} 1.0' in text
    await client.ws.close()


@pytest.mark.parametrize(("path", "status", "content_type"), [
    ("/", 200, "text/html; charset=utf-8"),
    ("/app.js", 200, "text/javascript; charset=utf-8"),
    ("/../secret.txt", 404, None),
    ("/%2e%2e/secret.txt", 404, None),
    ("/missing.css", 404, None),
])
async def test_static_files_are_traversal_safe(server, path, status, content_type):
    """Static files are served with their content type; paths leaving the web root and misses are 404."""
    got, headers, body = await http_request(server.port, path)
    assert got == status
    if content_type is not None:
        assert headers["content-type"] == content_type
    assert b"do not serve" not in body


def test_default_web_root_is_the_packaged_demo():
    """Without server.web_dir the demo comes from the package itself (importlib.resources), not the checkout."""
    import realtime_ming
    from realtime_ming.server.http import default_web_roots

    (root,) = default_web_roots(None)
    assert root == Path(realtime_ming.__file__).resolve().parent / "web"
    assert (root / "index.html").is_file() and (root / "js" / "main.js").is_file()


async def test_missing_demo_is_one_warning_at_start(engine, tmp_path, caplog):
    """An empty web folder: one WARNING line naming it when the server starts, then GET / is 404."""
    empty = tmp_path / "empty"
    empty.mkdir()
    caplog.set_level(logging.INFO)
    async with RealtimeServer(_config(empty), engine) as srv:
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "browser demo not found" in warnings[0].getMessage()
        assert str(empty) in warnings[0].getMessage() and "\n" not in warnings[0].getMessage()
        assert (await http_request(srv.port, "/"))[0] == 404


async def test_other_methods_are_405(server):
    """POST is not served."""
    status, _, _ = await http_request(server.port, "/health", method="POST", headers={"Content-Length": "0"})
    assert status == 405


async def test_websocket_only_on_realtime_path(server):
    """A WebSocket upgrade on another path is refused with 404."""
    with pytest.raises(InvalidStatus) as info:
        await connect(f"ws://127.0.0.1:{server.port}/v1/other")
    assert info.value.response.status_code == 404


# ---- handshake ------------------------------------------------------------------------------


@pytest.fixture
async def keyed_server(engine, web_dir):
    cfg = _config(web_dir, "server.auth.api_keys=[k1]", "server.auth.allowed_origins=[http://good.example]")
    async with RealtimeServer(cfg, engine) as srv:
        yield srv


@pytest.mark.parametrize("how", ["bearer", "api-key", "subprotocol"])
async def test_api_key_accepted_three_ways(keyed_server, how):
    """Bearer header, api-key header and the browser subprotocol each authenticate; `realtime` is echoed."""
    kwargs = {
        "bearer": {"additional_headers": {"Authorization": "Bearer k1"}},
        "api-key": {"additional_headers": {"api-key": "k1"}},
        "subprotocol": {"subprotocols": ["realtime", "openai-insecure-api-key.k1"]},
    }[how]
    client = await _open(keyed_server, **kwargs)
    assert client.ws.subprotocol == ("realtime" if how == "subprotocol" else None)
    await client.ws.close()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}])
async def test_missing_or_wrong_key_is_401(keyed_server, headers):
    """No key or a wrong key: HTTP 401 before the upgrade, counted as a refusal."""
    with pytest.raises(InvalidStatus) as info:
        await connect(_url(keyed_server), additional_headers=headers)
    assert info.value.response.status_code == 401
    _, _, body = await http_request(keyed_server.port, "/metrics")
    assert 'realtime_ming_refusals_total{reason="auth"}' in body.decode()


async def test_origin_allow_list(keyed_server):
    """A listed Origin passes, another is 403."""
    auth = {"Authorization": "Bearer k1"}
    client = await _open(keyed_server, additional_headers=auth, origin="http://good.example")
    await client.ws.close()
    with pytest.raises(InvalidStatus) as info:
        await connect(_url(keyed_server), additional_headers=auth, origin="http://evil.example")
    assert info.value.response.status_code == 403


@pytest.mark.parametrize("how", ["header", "subprotocol"])
async def test_beta_dialect_detected(server, how):
    """`OpenAI-Beta: realtime=v1` or the `openai-beta.realtime-v1` subprotocol select the beta shape."""
    kwargs = ({"additional_headers": {"OpenAI-Beta": "realtime=v1"}} if how == "header"
              else {"subprotocols": ["realtime", "openai-beta.realtime-v1"]})
    ws = await connect(_url(server, "?model=x&unknown=1"), **kwargs)
    client = WsClient(ws, Dialect.BETA)
    session = (await client.recv())["session"]
    assert "type" not in session and session["input_audio_format"] == "pcm16"
    await ws.close()


async def test_session_limit_closes_with_1013(engine, web_dir):
    """Beyond max_sessions the connection is closed with 1013 (try again later)."""
    async with RealtimeServer(_config(web_dir, "server.limits.max_sessions=1"), engine) as srv:
        first = await _open(srv)
        second = await connect(_url(srv))
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(second.recv(), seconds(5))
        assert info.value.rcvd.code == CloseCode.TRY_AGAIN_LATER
        await _still_serving(first)
        await first.ws.close()


async def test_idle_timeout_sends_error_then_closes(engine, web_dir):
    """No client frame for idle_timeout_s: an idle_timeout error, then close 1000 naming the reason."""
    async with RealtimeServer(_config(web_dir, "server.limits.idle_timeout_s=0.3"), engine) as srv:
        client = await _open(srv)
        await client.expect_error("idle_timeout")
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(client.ws.recv(), seconds(5))
        assert info.value.rcvd.code == CloseCode.NORMAL_CLOSURE
        assert info.value.rcvd.reason.startswith("idle timeout")


async def test_idle_timeout_counts_from_the_last_frame(engine, web_dir):
    """Frames keep a session open past idle_timeout_s (its one timer re-arms); the timeout runs from the last."""
    async with RealtimeServer(_config(web_dir, "server.limits.idle_timeout_s=0.4"), engine) as srv:
        warm = await _open(srv)  # the first session of a process pays one-time setup on the loop
        await _still_serving(warm)
        await warm.ws.close()
        client = await _open(srv)
        loop = asyncio.get_running_loop()
        began = loop.time()
        while loop.time() - began < 1.2:  # three idle timeouts long, a frame every 0.1 s
            await client.send(type="input_audio_buffer.append", audio=pcm16_b64(tone(0.02)))
            last = loop.time()
            await asyncio.sleep(0.1)
        await client.expect_error("idle_timeout")
        assert loop.time() - last >= 0.35  # not an error queued while the frames still came


async def test_shutdown_closes_sessions_with_1001(engine, web_dir):
    """Graceful shutdown closes open sessions with 1001 (going away)."""
    srv = RealtimeServer(_config(web_dir), engine)
    await srv.start()
    client = await _open(srv)
    await srv.close()
    with pytest.raises(ConnectionClosed) as info:
        await asyncio.wait_for(client.ws.recv(), seconds(5))
    assert info.value.rcvd.code == CloseCode.GOING_AWAY


# ---- bad input is non-fatal -----------------------------------------------------------------


async def test_bad_frames_each_get_one_error_and_the_session_continues(engine, web_dir):
    """Binary, malformed JSON, non-object, unknown type, bad base64, wrong rate, oversize frame and
    out-of-order events: one error each with its stable code; the next frame is still served."""
    async with RealtimeServer(_config(web_dir, "server.limits.max_frame_bytes=65536"), engine) as srv:
        client = await _open(srv)
        cases = [
            (b"\x00\x01", "binary_frame_unsupported"),
            ("{not json", "invalid_json"),
            ("[1, 2]", "invalid_event"),
            (json.dumps({"type": "no.such.event", "event_id": "e1"}), "unknown_event"),
            (json.dumps({"type": "input_audio_buffer.append", "audio": "@@@"}), "invalid_audio"),
            (json.dumps({"type": "session.update", "session": {
                "type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 22050}}}}}),
             "unsupported_sample_rate"),
            (json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 100_000}), "frame_too_large"),
            (json.dumps({"type": "response.cancel"}), "response_cancel_not_active"),
            (json.dumps({"type": "conversation.item.truncate", "item_id": "item_x", "content_index": 0,
                         "audio_end_ms": 5}), "item_truncate_invalid_item_id"),
            (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty"),
        ]
        for frame, code in cases:
            await client.ws.send(frame)
            error = await client.expect_error(code)
            if code == "unknown_event":
                assert error["event_id"] == "e1"
            await _still_serving(client)
        await client.ws.close()


async def test_large_frames_bounded_by_event_type(engine, web_dir):
    """Issue 43 finding 2: an event that carries no media is capped far below the frame limit (a response.create
    too, unless it carries media), tools in all at 1 MiB of JSON, both refused with their code and param before the
    frame is checked; a large media frame (parsed in the frame parser's own process) is served as any other."""
    async with RealtimeServer(_config(web_dir, "server.limits.max_control_frame_bytes=4096"), engine) as srv:
        assert limits_parser(srv.cfg.server.limits).running  # started with the server, not by the first large frame
        client = await _open(srv)
        await client.send(type="session.update", session={"type": "realtime", "instructions": "x" * 5000},
                          event_id="big1")
        error = await client.expect_error("event_frame_too_large")
        assert (error["param"], error["event_id"]) == ("type", "big1")
        assert "'session.update'" in error["message"] and "4096" in error["message"]
        tool = {"type": "function", "name": "t", "description": "d" * 8192}
        tools = [dict(tool, name=f"t{i}") for i in range(128)]
        await client.send(type="response.create", response={"tools": tools}, event_id="big2")
        error = await client.expect_error("event_frame_too_large")
        assert (error["param"], error["event_id"]) == ("type", "big2") and "'response.create'" in error["message"]
        image = {"type": "message", "role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}
        await client.send(type="response.create", response={"tools": tools, "input": [image]})  # may carry media
        error = await client.expect_error("tools_too_large", timeout=60)
        assert error["param"] == "response.tools"
        await _still_serving(client)
        audio = pcm16_b64(tone(1.5))  # 96 kB of base64: over the inline size, parsed in the other process
        await client.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        await client.recv_until("session.updated")
        await client.send(type="input_audio_buffer.append", audio=audio)
        await client.send(type="input_audio_buffer.commit")
        await client.recv_until("input_audio_buffer.committed")
        await client.ws.close()


async def test_manual_turn_through_the_socket(server, engine):
    """append → commit → response.create yields a completed response with audio deltas, in order."""
    client = await _open(server)
    await client.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    await client.recv_until("session.updated")
    await client.send(type="input_audio_buffer.append", audio=pcm16_b64(tone(0.3)))
    await client.send(type="input_audio_buffer.commit")
    await client.send(type="response.create")
    frames = await client.recv_until("response.done")
    types = [f["type"] for f in frames]
    assert types.index("input_audio_buffer.committed") < types.index("response.created")
    assert types.count("response.output_audio.delta") >= 2
    assert types.index("response.output_audio.done") < types.index("response.done")
    assert frames[-1]["response"]["status"] == "completed"
    await client.ws.close()


async def test_disconnect_mid_response_frees_the_engine_turn(web_dir):
    """A client vanishing mid-response cancels its turn: the engine holds no turn afterwards."""
    engine = StubEngine(words=("word ",) * 200, step_s=0.05)  # a 10 s turn: only a cancel ends it early
    async with RealtimeServer(_config(web_dir), engine) as server:
        await _disconnect_mid_response(server, engine)
    engine.close()


async def _disconnect_mid_response(server: RealtimeServer, engine: StubEngine) -> None:
    client = await _open(server)
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
    await client.send(type="response.create")
    await client.recv_until("response.output_audio.delta")
    assert engine.num_turns() == 1
    client.ws.transport.abort()
    await asyncio.wait_for(server.wait_idle(), seconds(5))
    assert engine.num_turns() == 0


def test_serves_on_uvloop(engine, web_dir):
    """The server runs on a uvloop event loop (as `realtime-ming serve` does): HTTP and a session work."""
    import uvloop

    async def scenario() -> tuple[int, str]:
        async with RealtimeServer(_config(web_dir), engine) as srv:
            status, _, _ = await http_request(srv.port, "/health")
            client = await _open(srv)
            await _still_serving(client)
            await client.ws.close()
            return status, type(asyncio.get_running_loop()).__module__

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        status, loop_module = runner.run(scenario())
    assert status == 200 and loop_module.startswith("uvloop")


class _CrashOnTextEngine(StubEngine):
    """Injected fault: `submit` raises for a turn whose last user text is "crash"."""

    def submit(self, request, sink) -> None:
        last = request.history[-1].content[0] if request.history else None
        if last is not None and last.text == "crash":
            raise RuntimeError("injected engine fault")
        super().submit(request, sink)


async def _text_turn(client: WsClient, text: str) -> None:
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await client.send(type="response.create")


async def test_internal_failure_costs_only_that_request(web_dir):
    """A fault inside one session's request: a server_error event and a failed response there, the
    session lives on (its next turn completes), and another session is untouched."""
    engine = _CrashOnTextEngine()
    async with RealtimeServer(_config(web_dir), engine) as srv:
        healthy, doomed = await _open(srv), await _open(srv)
        await doomed.send(type="conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "crash"}]})
        await doomed.send(type="response.create", event_id="evt_crash")
        frames = await doomed.recv_until("response.done")
        errors = [f["error"] for f in frames if f["type"] == "error"]
        assert [(e["code"], e["event_id"]) for e in errors] == [("server_error", "evt_crash")]
        assert frames[-1]["response"]["status"] == "failed"
        assert frames[-1]["response"]["status_details"]["error"]["code"] == "server_error"
        await _text_turn(doomed, "hello")
        assert (await doomed.recv_until("response.done"))[-1]["response"]["status"] == "completed"
        await _text_turn(healthy, "hello")
        assert (await healthy.recv_until("response.done"))[-1]["response"]["status"] == "completed"
        await healthy.ws.close()
        await doomed.ws.close()
    engine.close()
