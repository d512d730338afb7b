"""Connection hand-off for `server.frontend_processes` >= 2: the engine process accepts, the least-loaded front end serves.

When N processes all wait in accept() on one listening socket, the kernel wakes whichever is first and
its event loop accepts every queued connection: a burst of 64 sessions lands unevenly (37 / 19 / 1 / 7 over
4 front ends, docs/benchmarks.md), and a front end past ~30-45 real-time
sessions saturates its GIL. So the front ends do not accept at all:

- `Dispatcher` (the engine process, on its supervising thread): accepts on the listening socket and hands
  each connection (its file descriptor, `SCM_RIGHTS` over one `SOCK_SEQPACKET` unix socket pair per front
  end) to the ready front end with the fewest open connections (ties: round robin). A front end tells it,
  on the same socket, how many of its connections closed, so the count is exact at any burst size. A
  front end whose queue is full (busy) is skipped; one whose socket is gone is no longer chosen. While no
  front end is ready (all restarting) nothing is accepted: connections wait in the kernel's backlog.
- `Adopter` (a front end): receives the descriptors and gives each to the same websockets server that a
  listening socket would (`loop.connect_accepted_socket` with the server's protocol factory, which
  `HandoffLoop` records when websockets calls `create_server`); TLS (`server.tls`) is negotiated there,
  in the front end, as with a listening socket. The server itself listens on nothing
  (`start_serving=False` on the inherited socket, which only names the port).

A front end that dies loses its open sessions and the connections handed to it but not yet adopted (their
clients see the connection close); connections not yet accepted stay in the one backlog for the others.
Linux / POSIX only (`socket.send_fds`), as the front ends themselves.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import selectors
import socket
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any

try:
    import uvloop

    _BaseLoop: type = uvloop.Loop
except ImportError:  # pragma: no cover - the front ends run uvloop where it exists
    _BaseLoop = asyncio.SelectorEventLoop

__all__ = ["Adopter", "Dispatcher", "HandoffLoop", "channel_pair"]

log = logging.getLogger(__name__)

_REPORT = struct.Struct("!BI")  # front end -> dispatcher: (kind, count)
_RECEIVED, _CLOSED = 0, 1  # it took this many connections off the channel / this many of its connections closed
_ACCEPTS_PER_WAKE = 64  # then the closes and signals get a look in
_FDS_PER_MESSAGE = 1


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """(dispatcher's end, front end's end) of a new hand-off channel."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class HandoffLoop(_BaseLoop):
    """The front end's event loop. A server created on a socket named by `adopt_on` first does not accept on
    it (the socket only names the address): it reports itself serving until closed, and `protocol_factory_for`
    gives its protocol factory, so that connections handed over join it (`Adopter`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._adopting: dict[int, Callable[[], asyncio.Protocol] | None] = {}

    def adopt_on(self, sock: socket.socket) -> None:
        self._adopting[sock.fileno()] = None

    async def create_server(self, protocol_factory, *args: Any, **kwargs: Any):  # type: ignore[override]
        sock = kwargs.get("sock")
        if sock is None or sock.fileno() not in self._adopting:
            return await super().create_server(protocol_factory, *args, **kwargs)
        self._adopting[sock.fileno()] = protocol_factory
        kwargs["start_serving"] = False
        return _AdoptingServer(await super().create_server(protocol_factory, *args, **kwargs))

    def protocol_factory_for(self, sock: socket.socket) -> Callable[[], asyncio.Protocol]:
        factory = self._adopting.pop(sock.fileno(), None)
        if factory is None:
            raise RuntimeError("no server was created on this socket after adopt_on()")
        return factory


class _AdoptingServer:
    """An `asyncio.Server` that never accepts but serves (adopted connections) until closed."""

    def __init__(self, server: asyncio.AbstractServer) -> None:
        self._server = server
        self._closed = False

    def is_serving(self) -> bool:
        return not self._closed

    def close(self) -> None:
        self._closed = True
        self._server.close()

    async def start_serving(self) -> None:
        return None  # connections come handed over, never through accept()

    def __getattr__(self, name: str) -> Any:  # sockets, wait_closed, get_loop, serve_forever, ...
        return getattr(self._server, name)


class Dispatcher:
    """Accepts on `sock` and hands the connections out (the engine process; one thread calls `run_for`)."""

    def __init__(self, sock: socket.socket, n: int) -> None:
        self.sock = sock
        self.channels: list[socket.socket | None] = [None] * n
        self.ready = [False] * n
        self.open = [0] * n  # connections handed to front end i and not yet closed there
        self.handed = [0] * n
        self._unreceived: list[collections.deque[socket.socket]] = [collections.deque() for _ in range(n)]
        self._next = 0
        self._selector = selectors.DefaultSelector()
        self._accepting = False

    def new_channel(self, i: int) -> socket.socket:
        """A fresh channel for (re)started front end `i` (not ready until `mark_ready`): the front end's end."""
        self.drop(i)
        ours, theirs = channel_pair()
        ours.setblocking(False)
        self.channels[i] = ours
        self._selector.register(ours, selectors.EVENT_READ, i)
        return theirs

    def mark_ready(self, i: int) -> None:
        if self.channels[i] is not None:
            self.ready[i] = True

    def drop(self, i: int) -> None:
        """Front end `i` is gone or going: close its channel; what it had not received goes to the others."""
        chan = self.channels[i]
        if chan is None:
            return
        self._read_reports(i, until_eof=False)  # its last receipts: those connections are its own
        self.channels[i] = None
        self.ready[i] = False
        self.open[i] = 0
        self._selector.unregister(chan)
        chan.close()
        orphans, self._unreceived[i] = self._unreceived[i], collections.deque()
        for conn in orphans:
            with conn:
                if not self._hand(conn):
                    log.warning("no front end could take a connection (all busy or restarting); closed it")
        if orphans:
            log.info("front end %d left %d connection(s) unreceived; handed to the others", i, len(orphans))

    def close(self) -> None:
        for i, chan in enumerate(self.channels):
            if chan is not None:
                self._selector.unregister(chan)
                chan.close()
                self.channels[i] = None
            for conn in self._unreceived[i]:
                conn.close()
            self._unreceived[i].clear()
        self._selector.close()

    def run_for(self, timeout_s: float) -> None:
        """Hand out what arrives within `timeout_s` (returns early after some work); reads the front ends' reports."""
        accepting = any(self.ready)
        if accepting != self._accepting:  # nobody to hand to: leave new connections in the kernel's backlog
            if accepting:
                self._selector.register(self.sock, selectors.EVENT_READ, None)
            else:
                self._selector.unregister(self.sock)
            self._accepting = accepting
        if not self._selector.get_map():
            time.sleep(timeout_s)
            return
        for key, _ in self._selector.select(timeout_s):
            if key.data is None:
                self._accept()
            else:
                self._read_reports(key.data, until_eof=True)

    # ---- internals -------------------------------------------------------------------------------------
    def _read_reports(self, i: int, until_eof: bool) -> None:
        chan = self.channels[i]
        while chan is not None:
            try:
                data = chan.recv(_REPORT.size)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if len(data) != _REPORT.size:  # EOF: the front end closed its end (stopping, or dead)
                if until_eof:
                    self.drop(i)
                return
            kind, count = _REPORT.unpack(data)
            if kind == _RECEIVED:
                for _ in range(min(count, len(self._unreceived[i]))):
                    self._unreceived[i].popleft().close()  # it holds its own copy now
            else:
                self.open[i] = max(0, self.open[i] - count)

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE, ECONNABORTED, ...: this one is lost, the listener lives
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.error("accept failed: %s", exc)
                    return
                continue
            if not self._hand(conn):
                conn.close()
                log.warning("no front end could take a connection (all busy or restarting); closed it")

    def _hand(self, conn: socket.socket) -> bool:
        """Send `conn` to the least-loaded ready front end; ours is kept (a dup) until it reports receiving it."""
        for i in self._by_load():
            chan = self.channels[i]
            try:
                socket.send_fds(chan, [b"c"], [conn.fileno()])
            except (BlockingIOError, InterruptedError):
                continue  # its queue is full (busy): the next one
            except OSError as exc:  # the front end is gone, or too many descriptors in flight
                log.debug("hand-off to front end %d failed: %s", i, exc)
                if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                    self.ready[i] = False
                continue
            self._unreceived[i].append(conn.dup())
            self.open[i] += 1
            self.handed[i] += 1
            self._next = (i + 1) % len(self.channels)
            return True
        return False

    def _by_load(self) -> list[int]:
        n = len(self.channels)
        order = [(self._next + k) % n for k in range(n)]
        return sorted((i for i in order if self.ready[i] and self.channels[i] is not None), key=lambda i: self.open[i])


class Adopter:
    """A front end's end of its channel: connections handed over join `factory`'s server (this loop)."""

    def __init__(self, channel: socket.socket, factory: Callable[[], asyncio.Protocol],
                 tls: ssl.SSLContext | None, handshake_timeout_s: float) -> None:
        self._channel = channel
        self._factory = factory
        self._tls = {} if tls is None else {"ssl": tls, "ssl_handshake_timeout": handshake_timeout_s}
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task] = set()
        self._unreported = {_RECEIVED: 0, _CLOSED: 0}
        self._retry: asyncio.TimerHandle | None = None
        self._open = True
        channel.setblocking(False)
        self._loop.add_reader(channel.fileno(), self._receive)

    @property
    def connections(self) -> int:
        """Handed-over connections not yet closed."""
        return len(self._tasks)

    def close(self) -> None:
        """Adopt nothing more (the dispatcher sees the channel close: what is still queued goes to the others)."""
        if self._open:
            self._open = False
            if self._retry is not None:
                self._retry.cancel()
            self._loop.remove_reader(self._channel.fileno())
            self._channel.close()

    def _receive(self) -> None:
        while self._open:
            try:
                _, fds, _, _ = socket.recv_fds(self._channel, 16, _FDS_PER_MESSAGE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.error("connection hand-off channel failed: %s", exc)
                self.close()
                return
            if not fds:  # EOF: the engine process is gone (the engine connection reports it)
                self.close()
                return
            self._report(_RECEIVED, len(fds))  # at once: from here on a crash of ours loses them, not before
            for fd in fds:
                task = self._loop.create_task(self._adopt(socket.socket(fileno=fd)))
                self._tasks.add(task)
                task.add_done_callback(self._adopted_done)

    async def _adopt(self, sock: socket.socket) -> None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not TCP (tests), or already reset
        try:
            _, connection = await self._loop.connect_accepted_socket(self._factory, sock, **self._tls)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:  # a failed TLS handshake, a reset
            log.debug("handed-over connection failed to open: %s", exc)
            sock.close()
            return
        await connection.wait_closed()

    def _adopted_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("handed-over connection failed", exc_info=task.exception())
        self._report(_CLOSED, 1)

    def _report(self, kind: int | None = None, count: int = 0) -> None:
        """Tell the dispatcher what was received / closed (retried shortly while its queue is full)."""
        if kind is not None:
            self._unreported[kind] += count
        if not self._open or (kind is not None and self._retry is not None):
            return  # a retry is scheduled: it sends this too
        self._retry = None
        for kind_, pending in self._unreported.items():
            if not pending:
                continue
            try:
                self._channel.send(_REPORT.pack(kind_, pending))
            except (BlockingIOError, InterruptedError):
                self._retry = self._loop.call_later(0.02, self._report)
                return
            except OSError:
                return  # the engine process is gone
            self._unreported[kind_] = 0
