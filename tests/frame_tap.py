"""A validating WebSocket tap for tests that drive the server with third-party clients (pipecat, LiveKit).

Such a client owns its socket, so its frames are checked on the way: the tap listens on a free loopback port,
opens one upstream connection to the real server per client connection (same path and query, the client's
`Authorization` / `OpenAI-Beta` headers), forwards both ways byte for byte, and validates every server frame
against the openai package's unions (`server_support.validate_frame`, dialect from the `OpenAI-Beta` header).
A frame that does not validate is still forwarded (the client's own reaction is part of the test) and recorded
in `failures`; tests assert that list is empty. Nothing here is a test.
"""

from __future__ import annotations

import asyncio
import json
from typing import Self

from server_support import validate_frame
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from realtime_ming.protocol import Dialect

_FORWARDED_HEADERS = ("authorization", "openai-beta")


class FrameTap:
    """`async with FrameTap(server_port) as tap:` then point the client at `tap.url`."""

    def __init__(self, upstream_port: int, path: str = "/v1/realtime") -> None:
        self.upstream_port = upstream_port
        self.path = path
        self.frames: list[dict] = []  # every server frame, in order, across connections
        self.sent: list[dict] = []  # every client frame
        self.failures: list[str] = []
        self._server = None

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{self.path}"

    def types(self) -> list[str]:
        return [f["type"] for f in self.frames]

    async def __aenter__(self) -> Self:
        self._server = await serve(self._handle, "127.0.0.1", 0, max_size=None)
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, client) -> None:
        headers = {k: v for k, v in client.request.headers.raw_items() if k.lower() in _FORWARDED_HEADERS}
        dialect = Dialect.BETA if "openai-beta" in {k.lower() for k in headers} else Dialect.GA
        url = f"ws://127.0.0.1:{self.upstream_port}{client.request.path}"
        async with connect(url, additional_headers=headers, max_size=None) as upstream:
            async def down() -> None:
                async for message in upstream:
                    self._check(message, dialect)
                    await client.send(message)

            async def up() -> None:
                async for message in client:
                    if isinstance(message, str):
                        self.sent.append(json.loads(message))
                    await upstream.send(message)

            tasks = [asyncio.create_task(down()), asyncio.create_task(up())]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def _check(self, message, dialect: Dialect) -> None:
        try:
            frame = json.loads(message)
            self.frames.append(frame)
            validate_frame(frame, dialect)
        except (AssertionError, ValueError) as exc:  # pydantic's ValidationError is a ValueError; asserted by the test
            self.failures.append(f"{str(message)[:200]}: {exc}")
