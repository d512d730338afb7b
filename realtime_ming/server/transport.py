"""The socket under one realtime session, whatever serves it: the `websockets` server or an ASGI server.

`serve_connection` (connection.py) runs the protocol over a `Transport`: receive a text/binary frame,
send a text frame, close with a code (bounded by the caller), abort. A transport that finds the peer
gone raises `TransportClosed`. `WebsocketsTransport` adapts a `websockets` ServerConnection;
`server/asgi.py` has the ASGI one (Ray Serve, uvicorn).
"""

from __future__ import annotations

from typing import Protocol

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from .big_frames import BigText, FrameConnection

__all__ = ["Transport", "TransportClosed", "WebsocketsTransport"]


class TransportClosed(Exception):
    """The peer closed the connection (or it broke): nothing more can be received or sent."""


class Transport(Protocol):
    async def recv(self) -> str | bytes | BigText:
        """The next message (a large text frame received beside websockets: `BigText`); raises TransportClosed
        when the connection is gone."""
        ...

    async def send(self, frame: str) -> None:
        """Send one text frame; raises TransportClosed when the connection is gone."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """The closing handshake (the caller bounds its time and aborts past it)."""
        ...

    def abort(self) -> None:
        """Drop the connection at once (a peer that does not take the closing handshake)."""
        ...


class WebsocketsTransport:
    """A `websockets` server connection as a `Transport`."""

    __slots__ = ("ws",)

    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws

    async def recv(self) -> str | bytes | BigText:
        try:
            message = await self.ws.recv()
        except ConnectionClosed:
            raise TransportClosed from None
        return self.ws.claim(message) if isinstance(self.ws, FrameConnection) else message

    async def send(self, frame: str) -> None:
        try:
            await self.ws.send(frame)
        except ConnectionClosed:
            raise TransportClosed from None

    async def close(self, code: int, reason: str) -> None:
        await self.ws.close(code, reason)

    def abort(self) -> None:
        self.ws.transport.abort()
