"""HTTP abuse on the server's one port, over raw loopback sockets: odd, malformed and oversize
requests each get a specific 4xx (never a 5xx) and leave no traceback or error in the log; the
browser's subprotocol API key is never echoed; repeated credentials are refused with 401.

A few requests cannot be parsed as HTTP at all (non-ASCII request line, a control character in a
header, TLS bytes on the plain port): websockets' parser would close those connections without a
response; they get 400 `invalid_request` first (server/http_body.py). The engine is
`server_support.StubEngine` (no model output here).
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from server_support import StubEngine, seconds

from realtime_ming.server import RealtimeServer, load_config

_UPGRADE = (
    b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)


def _request(target: bytes, method: bytes = b"GET", headers: bytes = b"", protocol: bytes = b"HTTP/1.1") -> bytes:
    return method + b" " + target + b" " + protocol + b"\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n"


async def _exchange(port: int, raw: bytes) -> tuple[int | None, dict[str, str], bytes]:
    """Send `raw` → (status or None when the server closed without a response, headers lower-cased, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        data = b""
        async with asyncio.timeout(seconds(5)):
            while b"\r\n\r\n" not in data:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            if not head:
                return None, {}, b""
            status_line, *lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
            status = int(status_line.split()[1])
            if status != 101:  # read the rest of a plain response (Content-Length bytes)
                want = int(headers.get("content-length", "0"))
                while len(body) < want:
                    chunk = await reader.read(65536)
                    if not chunk:
                        break
                    body += chunk
            return status, headers, body
    finally:
        writer.close()


# name -> (raw request, expected status)
_ABUSE: dict[str, tuple[bytes, int]] = {
    "encoded slashes": (_request(b"/%2fetc%2fpasswd"), 404),
    "encoded slash in a name": (_request(b"/js%2f..%2f..%2fsecret"), 404),
    "300-character file name": (_request(b"/" + b"a" * 300), 404),
    "300-character name, encoded": (_request(b"/" + b"%61" * 300), 404),
    "3,000-segment path": (_request(b"/a" * 3000), 414),
    "40-segment path": (_request(b"/a" * 40), 404),
    "8 KB URL": (_request(b"/" + b"b" * 8100), 414),
    "over websockets' line limit": (_request(b"/" + b"b" * 9000), 414),
    "8 KB query": (_request(b"/health?" + b"q" * 8000), 414),
    "NUL byte": (_request(b"/index.html%00.png"), 400),
    "control character": (_request(b"/a%0d%0aSet-Cookie:x"), 400),
    "dot-dot": (_request(b"/../../etc/passwd"), 404),
    "encoded dot-dot": (_request(b"/%2e%2e/%2e%2e/etc/passwd"), 404),
    "backslash dot-dot": (_request(b"/..%5c..%5cetc%5cpasswd"), 404),
    "empty segment": (_request(b"//etc/passwd"), 404),
    "bad percent-encoding": (_request(b"/%zz"), 400),
    "truncated percent-encoding": (_request(b"/index.html%4"), 400),
    "percent-encoded non-UTF-8": (_request(b"/%ff%fe"), 400),
    "absolute-form target": (_request(b"http://evil.example/index.html"), 400),
    "asterisk target": (_request(b"*", b"OPTIONS"), 405),
    "query without path": (_request(b"?x=1"), 400),
    "bracketed host-like path": (_request(b"//[x/v1/realtime?model=1", headers=_UPGRADE), 404),
    "POST": (_request(b"/", b"POST", b"Content-Length: 0\r\n"), 405),
    "PUT /health": (_request(b"/health", b"PUT", b"Content-Length: 0\r\n"), 405),
    "DELETE /v1/realtime": (_request(b"/v1/realtime", b"DELETE"), 405),
    "HEAD /v1/realtime": (_request(b"/v1/realtime", b"HEAD"), 405),
    "TRACE": (_request(b"/", b"TRACE"), 405),
    "unknown method": (_request(b"/", b"BREW"), 405),
    "GET /v1/realtime without upgrade": (_request(b"/v1/realtime"), 426),
    "upgrade over HTTP/1.0": (_request(b"/v1/realtime", headers=_UPGRADE, protocol=b"HTTP/1.0"), 400),
    "malformed subprotocol header": (
        _request(b"/v1/realtime", headers=_UPGRADE + b"Sec-WebSocket-Protocol: ,;\r\n"), 400),
    "non-ASCII subprotocol": (
        _request(b"/v1/realtime", headers=_UPGRADE + b"Sec-WebSocket-Protocol: realtime, k.\xff\r\n"), 400),
    "two Origin headers": (
        _request(b"/v1/realtime", headers=_UPGRADE + b"Origin: http://a\r\nOrigin: http://b\r\n"), 400),
    "two Authorization headers": (
        _request(b"/v1/realtime", headers=_UPGRADE + b"Authorization: Bearer a\r\nAuthorization: Bearer b\r\n"), 401),
    "two api-key headers": (_request(b"/v1/realtime", headers=_UPGRADE + b"api-key: a\r\napi-key: b\r\n"), 401),
    "two key subprotocols": (_request(b"/v1/realtime", headers=_UPGRADE + (
        b"Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.a, openai-insecure-api-key.b\r\n")), 401),
    "9 KB header line": (_request(b"/", headers=b"X-Big: " + b"x" * 9000 + b"\r\n"), 431),
    "200 headers": (_request(b"/", headers=b"".join(b"X-%d: y\r\n" % i for i in range(200))), 431),
    "non-ASCII request line": (_request("/é".encode()), 400),
    "control character in a header": (_request(b"/health", headers=b"X-A: \x01\r\n"), 400),
    "control character in a body's header": (
        _request(b"/v1/realtime/voices", b"POST", b"Content-Type: \x01\r\nContent-Length: 5\r\n") + b"hello", 400),
    "header line without a colon": (_request(b"/", headers=b"no colon here\r\n"), 400),
    # request bodies are read off the stream (server/http_body.py, for POST /v1/realtime/voices): answered
    "request body": (_request(b"/", b"POST", b"Content-Length: 5\r\n") + b"hello", 405),
    "chunked body": (_request(b"/", b"POST", b"Transfer-Encoding: chunked\r\n") + b"0\r\n\r\n", 405),
    "TLS ClientHello on the plain port": (
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64) + b"\r\n\r\n", 400),
    "no spaces in the request line": (b"GARBAGE\r\n\r\n", 400),
    "unknown HTTP version": (_request(b"/", protocol=b"HTTP/2.0"), 400),
}

# Served normally: the abuse table above must not have made the server refuse these.
_NORMAL: dict[str, tuple[bytes, int]] = {
    "GET /": (_request(b"/"), 200),
    "HEAD /": (_request(b"/", b"HEAD"), 200),
    "GET /index.html": (_request(b"/index.html"), 200),
    "GET /health?x=1": (_request(b"/health?x=1#f"), 200),
    "HEAD /missing": (_request(b"/missing.css", b"HEAD"), 404),
}


@pytest.fixture
def engine():
    stub = StubEngine()
    yield stub
    stub.close()


def _quiet_log(caplog) -> None:
    """Nothing at WARNING or above and no record carrying a traceback."""
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [f"{r.levelname} {r.name}: {r.getMessage()}" for r in loud]


@pytest.mark.parametrize("keyed", [False, True], ids=["open", "keyed"])
async def test_abusive_requests_get_4xx_and_log_no_traceback(engine, caplog, keyed):
    """Every request of the table gets its 4xx, never >= 500 nor a close without an answer; the log stays quiet."""
    caplog.set_level(logging.INFO)
    overrides = ["server.port=0", "session.vad.enabled=false"]
    if keyed:
        overrides += ["server.auth.api_keys=[k1]", "server.auth.allowed_origins=[http://a]"]
    async with RealtimeServer(load_config(None, overrides), engine) as srv:
        got = {}
        for name, (raw, _) in _ABUSE.items():
            got[name] = (await _exchange(srv.port, raw))[0]
        for name, (raw, want) in _NORMAL.items():
            status, _, body = await _exchange(srv.port, raw)
            assert status == want, name
            if raw.startswith(b"HEAD"):
                assert body == b"", name
    expected = {name: want for name, (_, want) in _ABUSE.items()}
    if keyed:  # the key check comes before websockets validates the upgrade itself
        for name in ("DELETE /v1/realtime", "HEAD /v1/realtime", "GET /v1/realtime without upgrade",
                     "malformed subprotocol header", "non-ASCII subprotocol"):
            expected[name] = 401
        expected["two Origin headers"] = 403
    assert got == expected
    assert all(status is not None and 400 <= status < 500 for status in got.values())
    _quiet_log(caplog)


@pytest.mark.parametrize("name", ["control character in a header", "control character in a body's header",
                                  "non-ASCII request line", "no spaces in the request line"])
async def test_unparsable_request_gets_a_json_error_and_the_connection_ends(engine, caplog, name):
    """A head websockets' parser refuses is answered 400 with the OpenAI-style error body (`invalid_request`,
    the parser's reason) and `Connection: close`, then the connection ends; the server keeps serving."""
    caplog.set_level(logging.INFO)
    async with RealtimeServer(load_config(None, ["server.port=0", "session.vad.enabled=false"]), engine) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            writer.write(_ABUSE[name][0])
            async with asyncio.timeout(seconds(5)):
                data = await reader.read()  # to EOF: the server ends the connection after its answer
        finally:
            writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        assert status_line.startswith("HTTP/1.1 400 ") and headers["connection"] == "close"
        assert headers["content-type"] == "application/json" and int(headers["content-length"]) == len(body)
        error = json.loads(body)["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_request"
        assert error["message"].startswith("Malformed HTTP request: ") and error["param"] is None
        assert (await _exchange(srv.port, _NORMAL["GET /health?x=1"][0]))[0] == 200
    _quiet_log(caplog)


async def _handshake(port: int, headers: bytes) -> tuple[int | None, dict[str, str]]:
    status, response_headers, _ = await _exchange(port, _request(b"/v1/realtime?model=m", headers=_UPGRADE + headers))
    return status, response_headers


async def test_subprotocol_key_is_never_echoed(engine, caplog):
    """`realtime` is echoed next to the key; a key offered alone gets no subprotocol back, and no key leaks."""
    caplog.set_level(logging.INFO)
    secret = "sk-test-secret-123"
    cfg = load_config(None, ["server.port=0", "session.vad.enabled=false", f"server.auth.api_keys=[{secret}]"])
    async with RealtimeServer(cfg, engine) as srv:
        cases = {
            f"realtime, openai-insecure-api-key.{secret}": "realtime",
            f"openai-insecure-api-key.{secret}, realtime": "realtime",
            f"openai-insecure-api-key.{secret}": None,
            f"openai-insecure-api-key.{secret}, openai-beta.realtime-v1": "openai-beta.realtime-v1",
        }
        for offer, echoed in cases.items():
            status, headers = await _handshake(srv.port, f"Sec-WebSocket-Protocol: {offer}\r\n".encode())
            assert status == 101, offer
            assert headers.get("sec-websocket-protocol") == echoed, offer
            assert all(secret not in value for value in headers.values()), offer
        offer = b"Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.nope\r\n"
        wrong, headers = await _handshake(srv.port, offer)
        assert wrong == 401 and "sec-websocket-protocol" not in headers
    assert secret not in caplog.text
    _quiet_log(caplog)


async def test_one_key_per_source_passes_and_duplicates_are_refused(engine):
    """One Authorization header authenticates; the same header twice is 401 even with both keys valid."""
    cfg = load_config(None, ["server.port=0", "session.vad.enabled=false", "server.auth.api_keys=[k1, k2]"])
    async with RealtimeServer(cfg, engine) as srv:
        assert (await _handshake(srv.port, b"Authorization: Bearer k1\r\n"))[0] == 101
        assert (await _handshake(srv.port, b"Authorization: Bearer k1\r\nAuthorization: Bearer k2\r\n"))[0] == 401
        assert (await _handshake(srv.port, b"Authorization: Bearer k1\r\nAuthorization: Bearer k1\r\n"))[0] == 401
        assert (await _handshake(srv.port, b"api-key: k2\r\n"))[0] == 101
        assert (await _handshake(srv.port, b"Authorization: Basic azE6\r\n"))[0] == 401
        assert (await _handshake(srv.port, b"Authorization: Bearer \xff\xfe\r\n"))[0] == 401
