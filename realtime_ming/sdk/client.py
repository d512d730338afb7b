"""`RealtimeClient`: the `RealtimeAgent` API over a `/v1/realtime` WebSocket (GA or beta).

Opening dials, authenticates (`Authorization: Bearer`), reads `session.created` and starts one
reader task that parses every frame into a typed event. Failed dials are retried with
exponential backoff per `ReconnectPolicy`; with `resume=True` a dropped session is reopened (a
new server session: the conversation restarts) and every `update_session` change is replayed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.frames import CloseCode

from ..protocol import client_events as ce
from ..protocol.dialect import Dialect
from ..protocol.events import ClientEvent, ServerEvent
from ..protocol.server_events import SessionCreated
from ..protocol.session import SessionPatch
from .agent import AgentOptions, Opening, RealtimeAgent
from .errors import (
    AuthenticationError,
    ConnectError,
    ConnectionClosed,
    ProtocolViolation,
    RealtimeError,
)
from .events import parse_server_event

__all__ = ["ClientOptions", "RealtimeClient", "ReconnectPolicy", "realtime_url"]

log = logging.getLogger(__name__)

# Close codes and HTTP statuses after which trying again later can succeed.
_RETRY_CLOSE_CODES = frozenset({CloseCode.TRY_AGAIN_LATER, CloseCode.GOING_AWAY, CloseCode.SERVICE_RESTART})
_AUTH_STATUSES = frozenset({401, 403})

RetryCallback = Callable[[int, float, Exception], None]


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """How opening retries: up to `max_attempts` dials, waiting `initial_backoff_s` × `multiplier`^k
    (capped at `max_backoff_s`, ± `jitter` as a fraction) between them. Refused connections,
    timeouts, HTTP 429/5xx and closes with 1001/1012/1013 are retried; 401/403 never are.
    `resume=True` also reopens a session the server dropped and replays the session changes."""

    max_attempts: int = 3
    initial_backoff_s: float = 0.25
    max_backoff_s: float = 8.0
    multiplier: float = 2.0
    jitter: float = 0.1
    resume: bool = False

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("need 0 <= initial_backoff_s <= max_backoff_s")
        if self.multiplier < 1 or not 0 <= self.jitter < 1:
            raise ValueError("need multiplier >= 1 and 0 <= jitter < 1")

    def backoff_s(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        return base * (1 + random.uniform(-self.jitter, self.jitter))


@dataclass(frozen=True, slots=True)
class ClientOptions(AgentOptions):
    """`AgentOptions` plus the socket's: retry policy and the largest accepted frame in bytes."""

    reconnect: ReconnectPolicy = field(default_factory=ReconnectPolicy)
    max_message_bytes: int = 64 * 2**20


class _Retryable(Exception):
    """A failed dial worth another attempt."""


def realtime_url(url: str, model: str | None = None) -> str:
    """The WebSocket URL for `url`: http(s) → ws(s), a bare host gets `/v1/realtime`, a `/v1`
    base gets `/realtime`, and `model` is added as the `model` query parameter."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} (use ws://, wss://, http:// or https://)")
    path = parts.path.rstrip("/")
    if not path:
        path = "/v1/realtime"
    elif path.endswith("/v1"):
        path += "/realtime"
    query = parse_qsl(parts.query)
    if model is not None and not any(key == "model" for key, _ in query):
        query.append(("model", model))
    return urlunsplit((scheme, parts.netloc, path, urlencode(query), ""))


class RealtimeClient(RealtimeAgent):
    """A Realtime session on a remote server. Open with `await RealtimeClient.connect(url, ...)` or
    `async with RealtimeClient.connect(url, ...) as client`."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None,
        dialect: Dialect,
        options: ClientOptions,
        on_retry: RetryCallback | None,
    ) -> None:
        super().__init__(dialect, options)
        self.url = url
        self._api_key = api_key
        self._policy = options.reconnect
        self._max_message_bytes = options.max_message_bytes
        self._on_retry = on_retry
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()  # cleared while a dropped session is being reopened

    @classmethod
    def connect(
        cls,
        url: str,
        api_key: str | None = None,
        model: str | None = None,
        beta: bool = False,
        *,
        options: ClientOptions | None = None,
        on_retry: RetryCallback | None = None,
    ) -> Opening[RealtimeClient]:
        """Open a session at `url` (`ws://host:port/v1/realtime`, or `http://host:port`).

        `api_key` goes in `Authorization: Bearer`; `model` in the query; `beta=True` speaks the
        beta dialect (`OpenAI-Beta: realtime=v1`). `on_retry(attempt, delay_s, error)` is called
        before each retry. Raises `AuthenticationError` (401/403), `ConnectError` (every attempt
        failed) or `ProtocolViolation` (the first frame is not `session.created`).
        """
        client = cls(realtime_url(url, model), api_key=api_key, dialect=Dialect.BETA if beta else Dialect.GA,
                     options=options or ClientOptions(), on_retry=on_retry)
        return Opening(client._open)

    async def _open(self) -> RealtimeClient:
        ws, created = await self._dial()
        self._ws = ws
        await self._deliver(created)
        self._connected.set()
        self._reader = asyncio.create_task(self._read_loop(), name="realtime-client-reader")
        return self

    def _headers(self) -> dict[str, str]:
        headers = {}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        if self.dialect is Dialect.BETA:
            headers["OpenAI-Beta"] = "realtime=v1"
        return headers

    async def _dial(self) -> tuple[ClientConnection, ServerEvent]:
        """Connect and read `session.created`, retrying per the policy."""
        for attempt in range(1, self._policy.max_attempts + 1):
            try:
                return await self._dial_once()
            except _Retryable as exc:
                if attempt == self._policy.max_attempts:
                    raise ConnectError(f"{self.url}: {exc} (after {attempt} attempts)") from exc
                delay_s = self._policy.backoff_s(attempt)
                log.info("connecting to %s failed (%s); retrying in %.2f s", self.url, exc, delay_s)
                if self._on_retry is not None:
                    self._on_retry(attempt, delay_s, exc)
                await asyncio.sleep(delay_s)
        raise AssertionError("unreachable")

    async def _dial_once(self) -> tuple[ClientConnection, ServerEvent]:
        timeout_s = self.options.open_timeout_s
        try:
            ws = await ws_connect(self.url, additional_headers=self._headers(), max_size=self._max_message_bytes,
                                  open_timeout=timeout_s, compression=None)
        except websockets.InvalidStatus as exc:
            status, body = exc.response.status_code, exc.response.body.decode("utf-8", "replace")
            if status in _AUTH_STATUSES:
                raise AuthenticationError(status, body) from exc
            if status == 429 or status >= 500:
                raise _Retryable(f"HTTP {status}") from exc
            raise ConnectError(f"{self.url}: HTTP {status}: {body.strip()}") from exc
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            raise _Retryable(str(exc) or type(exc).__name__) from exc
        try:
            async with asyncio.timeout(timeout_s):
                frame = await ws.recv()
        except (TimeoutError, websockets.ConnectionClosed) as exc:
            await ws.close()
            code = exc.rcvd.code if isinstance(exc, websockets.ConnectionClosed) and exc.rcvd else None
            if isinstance(exc, TimeoutError) or code in _RETRY_CLOSE_CODES:
                raise _Retryable(f"no session.created (close code {code})") from exc
            raise ConnectError(f"{self.url}: closed before session.created (code {code})") from exc
        event = parse_server_event(frame, self.dialect)
        if not isinstance(event, SessionCreated):
            await ws.close(CloseCode.PROTOCOL_ERROR)
            raise ProtocolViolation(f"expected session.created first, got {event.type}", frame)
        return ws, event

    async def _read_loop(self) -> None:
        """The reader task: frames → typed events → the queue, until the session ends."""
        while True:
            assert self._ws is not None
            try:
                frame = await self._ws.recv()
            except websockets.ConnectionClosed as exc:
                if self._is_closing:
                    return
                code, reason = (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd else (None, "")
                if self._policy.resume and await self._resume(code, reason):
                    continue
                self._finish(ConnectionClosed(code, reason))
                return
            try:
                event = parse_server_event(frame, self.dialect)
            except ProtocolViolation as exc:
                self._finish(exc)
                await self._ws.close(CloseCode.PROTOCOL_ERROR, "unreadable server event")
                return
            await self._deliver(event)

    async def _resume(self, code: int | None, reason: str) -> bool:
        """Reopen a dropped session and replay the requested session changes; False = gave up."""
        log.warning("session dropped (%s %s); reopening", code, reason)
        self._connected.clear()
        try:
            ws, created = await self._dial()
        except RealtimeError as exc:
            self._finish(exc)
            self._connected.set()  # wake blocked senders: they now see the end
            return False
        self._ws = ws
        await self._deliver(created)
        if self._requested:
            update = ce.SessionUpdate(session=SessionPatch(dict(self._requested), self.dialect))
            await ws.send(json.dumps(update.to_wire(self.dialect)))
        self._connected.set()
        return True

    async def _transmit(self, event: ClientEvent) -> None:
        await self._connected.wait()
        if self._end is not None:
            raise self._end
        assert self._ws is not None
        try:
            await self._ws.send(json.dumps(event.to_wire(self.dialect), separators=(",", ":")))
        except websockets.ConnectionClosed as exc:
            code, reason = (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd else (None, "")
            raise ConnectionClosed(code, reason) from exc

    async def close(self) -> None:
        """Close the WebSocket normally (1000) and end the event stream; unread events are discarded.
        Idempotent."""
        if self._is_closing:
            return
        self._is_closing = True
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()  # it may be waiting on a full queue that nobody reads any more
            await asyncio.gather(self._reader, return_exceptions=True)
        self._finish(ConnectionClosed(CloseCode.NORMAL_CLOSURE, "closed by the client"), discard_pending=True)
        self._connected.set()
