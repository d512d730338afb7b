"""A real MCP server on loopback for tests: the `mcp` package's MCPServer over streamable HTTP (uvicorn in a
thread), with two tools (`add`, `get_weather`; `get_weather` answers after `slow_s` when given, `pad` more
characters after its answer when given); records the calls it served. `redirecting` answers every request
with a redirect to another URL."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackMcp:
    """The server and what it was asked (tool name, arguments, the request's headers)."""

    def __init__(self, slow_s: float | None = None, pad: int = 0) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        server = MCPServer("loopback-tools")

        @server.tool(description="The weather of a city.")
        async def get_weather(city: str) -> str:
            self.calls.append(("get_weather", {"city": city}))
            if slow_s is not None:
                await anyio.sleep(slow_s)
            return f"sunny in {city}" + "." * pad

        @server.tool(description="Add two integers.")
        def add(a: int, b: int) -> int:
            self.calls.append(("add", {"a": a, "b": b}))
            return a + b

        app = server.streamable_http_app()
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                     lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def start(self) -> LoopbackMcp:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the loopback MCP server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)


@contextmanager
def loopback_mcp(**kwargs):
    server = LoopbackMcp(**kwargs).start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def redirecting(target: str):
    """A loopback HTTP server (its URL yielded) that answers every request with a 307 to `target`; `hits`
    counts the requests it got."""

    class Redirect(BaseHTTPRequestHandler):
        def _redirect(self) -> None:
            server.hits += 1
            self.send_response(307)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_DELETE = _redirect

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    server.hits = 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}/mcp"
    finally:
        server.shutdown()
        thread.join(10)
