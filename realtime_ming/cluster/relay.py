"""The direct data path, proxy side: one client session relayed over one TCP connection to its replica.

Given a lease grant ({host, port, token, replica}) and the rest of the lease's streaming call,
`relay_direct` opens a `websockets` client connection to the replica's direct port, forwarding what the
replica's handshake acts on (the path and query, `Authorization` / `api-key`, `Origin`, `OpenAI-Beta`
and the offered subprotocols, every value of each, so auth and dialect behave exactly as on a single
server), then accepts the client's ASGI WebSocket with the replica's subprotocol and the
`x-realtime-ming-replica` header and relays text and binary messages both ways until one side closes:

* the replica closes (1000, 1001 drain, 1011 engine dead, 1013, 1009, ...): the client gets the
  same code and reason;
* the client closes: the replica gets the client's code (1000 when it cannot be sent on the wire);
* the replica vanishes (its connection drops without a close frame, or the lease call fails: the
  actor or its node died): the client gets an `error` event `replica_lost` and 1012;
* the replica refuses the upgrade (401, 403): the client gets that refusal;
* the direct port cannot be reached: the client is accepted and closed with 1011 naming the
  cause, and the proxy logs how to fix it (open the port range, or `data_path: serve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.frames import EXTERNAL_CLOSE_CODES, CloseCode
from websockets.protocol import State

from ..protocol.codec import serialise
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.server_events import Error
from ..server.asgi import asgi_request, refuse_upgrade
from ..server.handshake import inspect_handshake
from .lease import LEASE_HEADER, REPLICA_HEADER

__all__ = ["FORWARDED_HEADERS", "LOST_REASON", "UNREACHABLE_REASON", "close_replica_lost", "relay_direct"]

log = logging.getLogger(__name__)

FORWARDED_HEADERS = frozenset({"authorization", "api-key", "origin", "openai-beta"})
LOST_REASON = "replica lost; reconnect"
UNREACHABLE_REASON = "cluster data path unavailable: the proxy cannot reach the replica"
_RELAY_QUEUE = 32  # messages from the replica buffered in the proxy per session before it stops reading
_LEASE_END_WAIT_S = 5.0  # after the session: how long the lease call may take to end before it is cancelled


def _sendable(code: int | None) -> int:
    """A close code that may go on the wire (1005/1006/1015 and unknown ones become 1000)."""
    if code is not None and (code in EXTERNAL_CLOSE_CODES or 3000 <= code <= 4999):
        return int(code)
    return int(CloseCode.NORMAL_CLOSURE)


async def close_replica_lost(scope: dict, send) -> None:
    """The session's replica is gone: an `error` event `replica_lost` in the client's dialect, then 1012."""
    dialect = inspect_handshake(asgi_request(scope)).dialect
    frame = serialise(Error.from_protocol_error(ProtocolError(ErrorCode.REPLICA_LOST)), dialect)
    with contextlib.suppress(Exception):
        if frame is not None:
            await send({"type": "websocket.send", "text": frame})
        await send({"type": "websocket.close", "code": int(CloseCode.SERVICE_RESTART), "reason": LOST_REASON})


def direct_uri(scope: dict, grant: dict[str, Any]) -> str:
    host = str(grant["host"])
    host = f"[{host}]" if ":" in host else host
    return f"ws://{host}:{int(grant['port'])}{asgi_request(scope).path}"


def forwarded_headers(scope: dict, token: str) -> list[tuple[str, str]]:
    """The client's headers the replica's handshake reads (every value, in order), plus the lease token."""
    headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope.get("headers") or ()
               if name.decode("latin-1").lower() in FORWARDED_HEADERS]
    headers.append((LEASE_HEADER, token))
    return headers


async def _open(scope: dict, grant: dict[str, Any], open_timeout_s: float) -> ClientConnection:
    return await connect(direct_uri(scope, grant), additional_headers=forwarded_headers(scope, grant["token"]),
                         subprotocols=list(scope.get("subprotocols") or ()) or None, compression=None,
                         user_agent_header=None, proxy=None, open_timeout=open_timeout_s, max_size=None,
                         # bounded: a client that reads slowly stalls this connection's reads, so TCP pushes
                         # back to the replica and its slow-client limits act as on a single server (an
                         # unbounded queue would buffer the replica's output in the proxy without limit)
                         max_queue=_RELAY_QUEUE, ping_interval=20, ping_timeout=20, close_timeout=10)


async def _client_to_replica(receive, replica: ClientConnection) -> int | None:
    """Relay until the client disconnects (returns its close code) or the replica is gone (returns None)."""
    while True:
        message = await receive()
        if message["type"] != "websocket.receive":
            return message.get("code", int(CloseCode.NO_STATUS_RCVD))  # websocket.disconnect
        data = message.get("text")
        if data is None:
            data = message.get("bytes") or b""
        try:
            await replica.send(data)
        except ConnectionClosed:
            return None


async def _replica_to_client(replica: ClientConnection, send) -> bool:
    """Relay until the replica's connection ends; False when the client could not be written to."""
    try:
        async for data in replica:
            await send({"type": "websocket.send", "text": data} if isinstance(data, str)
                       else {"type": "websocket.send", "bytes": data})
    except ConnectionClosed:
        pass
    except (OSError, RuntimeError):  # the client is gone (the ASGI server reports it this way)
        return False
    return True


async def _lease_failure(lease_rest: AsyncIterator[Any]) -> BaseException | None:
    """Wait for the lease call to end: None when it ended normally, else the error (the replica died)."""
    try:
        async for _ in lease_rest:
            pass
    except Exception as exc:
        return exc
    return None


async def relay_direct(scope: dict, receive, send, grant: dict[str, Any], lease_rest: AsyncIterator[Any], *,
                       open_timeout_s: float = 10.0) -> bool:
    """Serve one client WebSocket (its `websocket.connect` already received) through the replica of `grant`.
    Returns whether the lease call ended (False: the caller should cancel it)."""
    lease_watch = asyncio.ensure_future(_lease_failure(lease_rest))
    try:
        replica = await _open(scope, grant, open_timeout_s)
    except InvalidStatus as exc:  # the replica refused the upgrade (API key, Origin): the same answer
        lease_watch.cancel()
        await refuse_upgrade(scope, send, exc.response)
        return False
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        lease_watch.cancel()
        log.error("direct data path: cannot reach replica %s at %s:%s (%s). Open the replicas' direct ports "
                  "(cluster config direct_port_range) to the proxies, or set data_path: serve",
                  grant.get("replica"), grant.get("host"), grant.get("port"), exc)
        await send({"type": "websocket.accept", "subprotocol": None})
        await send({"type": "websocket.close", "code": int(CloseCode.INTERNAL_ERROR), "reason": UNREACHABLE_REASON})
        return False
    try:
        await send({"type": "websocket.accept", "subprotocol": replica.subprotocol,
                    "headers": [(REPLICA_HEADER.encode(), str(grant.get("replica", "")).encode("latin-1"))]})
        await _relay(scope, receive, send, replica, lease_watch)
    finally:
        if replica.state is not State.CLOSED:
            replica.transport.abort()
        if not lease_watch.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(lease_watch), _LEASE_END_WAIT_S)
        lease_watch.cancel()
    return lease_watch.done() and not lease_watch.cancelled()


async def _relay(scope: dict, receive, send, replica: ClientConnection, lease_watch: asyncio.Future) -> None:
    upstream = asyncio.ensure_future(_client_to_replica(receive, replica))
    downstream = asyncio.ensure_future(_replica_to_client(replica, send))
    pending: set[asyncio.Future] = {upstream, downstream, lease_watch}
    try:
        while downstream not in (done := (await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED))[0]):
            if lease_watch in done:
                pending.discard(lease_watch)
                if lease_watch.result() is not None:  # the replica's actor (or node) died
                    log.warning("lease call of a direct session failed (replica lost): %s", lease_watch.result())
                    replica.transport.abort()
                    await close_replica_lost(scope, send)
                    return
            if upstream in done:
                pending.discard(upstream)
                code = upstream.result()
                if code is not None:  # the client left: close the replica's side with its code
                    with contextlib.suppress(Exception):
                        await replica.close(_sendable(code))
                    return
        if not downstream.result():  # the client can no longer be written to
            with contextlib.suppress(Exception):
                await replica.close()
            return
        received = replica.protocol.close_rcvd
        if received is not None:  # the replica closed: the client gets its code and reason
            with contextlib.suppress(Exception):
                await send({"type": "websocket.close", "code": _sendable(received.code), "reason": received.reason})
            return
        await close_replica_lost(scope, send)  # the connection dropped without a close frame
    finally:
        for task in (upstream, downstream):
            task.cancel()
        await asyncio.gather(upstream, downstream, return_exceptions=True)
