"""The direct data path, replica side: the replica's own `websockets` port and its session leases.

`DirectPort` binds the port (the first free one of `direct_port_range` on `direct_host`, default the
node's IP as Ray reports it), owns the `LeaseBook` and the `LeaseGate` the replica's `RealtimeServer`
checks every request with, and runs the replica deployment's streaming `lease` call: it yields the grant
({data_path, host, port, token, replica}) and stays open while the session lives, so Serve counts
the session against the replica's `max_ongoing_requests` as if the frames went through Serve.
The session itself runs on the same `RealtimeServer.serve_session` as `realtime-ming serve`.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import AsyncIterator
from typing import Any

from ..server.startup import StartupError, open_listener
from .lease import LeaseBook, LeaseGate

__all__ = ["DirectPort", "bind_in_range"]

_ANY = ("0.0.0.0", "::", "")


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def bind_in_range(host: str, port_range: tuple[int, int] | None) -> socket.socket:
    """A listening socket on `host` at the first free port of `port_range` (None: a free port the OS picks)."""
    first, last = port_range or (0, 0)
    problem: StartupError | None = None
    for port in range(first, last + 1):
        try:
            return open_listener(host, port)
        except StartupError as exc:
            if not isinstance(exc.__cause__, OSError) or exc.__cause__.errno != errno.EADDRINUSE:
                raise
            problem = exc
    raise StartupError(f"direct_port_range {first}-{last}: every port is in use on {host} ({problem})")


class DirectPort:
    """A replica's direct port: the bound socket, what the proxy is told to connect to, the leases."""

    def __init__(self, host: str | None, port_range: tuple[int, int] | None, lease_ttl_s: float,
                 advertise: str | None = None) -> None:
        bind = host if host is not None else _node_ip()
        if advertise is None:
            advertise = _node_ip() if bind in _ANY else bind
        self.sock = bind_in_range(bind, port_range)
        self.host = advertise
        self.port = self.sock.getsockname()[1]
        self.book = LeaseBook(lease_ttl_s)
        self.gate = LeaseGate(self.book)

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if _is_v6(self.host) else self.host
        return f"{host}:{self.port}"

    async def grants(self, replica_id: str) -> AsyncIterator[dict[str, Any]]:
        """The body of the replica's streaming `lease` call: one grant, then open until the lease ends."""
        lease = self.book.issue()
        try:
            yield {"data_path": "direct", "host": self.host, "port": self.port, "token": lease.token,
                   "replica": replica_id}
            await lease.wait_done()
        finally:
            self.book.revoke(lease)


def _is_v6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False
