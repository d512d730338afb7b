"""The engine of another process, as a front end sees it: `RemoteEngine` (`server.frontend_processes` >= 2).

One `multiprocessing.connection` connection (a unix socket, pickled `engine/api.py` values) joins a front
end to the engine process's `EngineHost` (server/engine_host.py). The front end sends commands
(`Submit` / `Confirm` / `Discard` / `Cancel` / `Close` / `Call`); the host answers with batches (one message
per flush: a list of `TurnEvent`s, `Reply`s and `EngineHealth`), and a reader thread here hands each event
to its turn's sink (as the engine thread does in one process: sinks must be cheap and thread-safe).

Health: the host reports the engine's health with every batch and at least every `HEARTBEAT_S`; a lost
connection (the engine process died) makes the engine dead here at once, and every open turn ends
`TurnFailed(ENGINE_UNAVAILABLE)`, as in one process.

Voices cloned at run time live in the engine process (their prompts are CUDA tensors): the front end
holds `CustomVoice` records whose `prompt` is a `PromptRef` (no tensor), the `VoiceStore` calls
(`RemoteVoiceStore`) and the encoding (`RemoteVoiceEncoder`) run there, and the host swaps the real voice
into a `TurnRequest` by id and owner. So every front end sees the same voices, scoped to their API key.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from typing import Any

import numpy as np

from ..engine.api import (
    EngineHealth,
    FailureCode,
    TurnCancelled,
    TurnDone,
    TurnFailed,
    TurnRequest,
)
from ..engine.commands import Cancel, Confirm, Discard

__all__ = ["HEARTBEAT_S", "PROMPT_CALLS", "SECRETS_CALL_PREFIX", "Call", "Cancel", "Close", "Confirm", "Discard", "Hello", "PromptRef",
           "Release", "RemoteClientSecrets", "RemoteEngine", "RemotePromptMeter", "RemoteVoiceEncoder", "RemoteVoiceStore", "Reply",
           "SessionTickets", "Status", "Submit", "hang_up"]

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.25  # the host sends the engine's health at least this often
CALL_TIMEOUT_S = 120.0  # a voice call (encoding a clip takes seconds on a busy GPU)
SECRETS_CALL_PREFIX = "secrets_"  # a Call of the host's client-secret store (`secrets_mint`, ...)
SECRETS_TIMEOUT_S = 10.0
PROMPT_CALL_TIMEOUT_S = 30.0  # a prompt measurement (bounded: at most a context's worth of encoding)
PROMPT_CALLS = ("system_tokens", "caption_tokens")  # the `PromptMeter` methods a front end calls
TERMINAL = (TurnDone, TurnCancelled, TurnFailed)


# ---- the wire: front end -> host -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Submit:
    request: TurnRequest


# Confirm / Discard / Cancel travel as the engine's own commands (`engine/commands.py`: one turn id each)


@dataclass(frozen=True, slots=True)
class Close:
    conversation_id: str


@dataclass(frozen=True, slots=True)
class Release:
    """A session ended: give its ticket back."""


@dataclass(frozen=True, slots=True)
class Call:
    """A request with a reply: `acquire_session` (a session ticket: True / False at the global limit), or a
    voice-store operation or an encoding (a method of the host's `VoiceHost`)."""

    call_id: int
    method: str
    args: tuple


# ---- the wire: host -> front end -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello:
    """The host's first message: what `RealtimeServer` asks an engine once."""

    info: dict
    voices: tuple[str, ...]
    can_clone: bool
    status: Status


@dataclass(frozen=True, slots=True)
class Status:
    """The engine's health and the sessions open on every front end (a heartbeat, or news)."""

    health: EngineHealth
    sessions: int


@dataclass(frozen=True, slots=True)
class Reply:
    call_id: int
    ok: bool
    value: Any  # the result, or the exception raised


@dataclass(frozen=True, slots=True)
class PromptRef:
    """A cloned voice's prompt as a front end holds it: a key into the engine process, no tensor."""

    key: str
    has_speaker: bool
    num_patches: int
    nbytes: int

    @property
    def spk_embed(self) -> object | None:  # what `CustomVoice.describe` reads
        return True if self.has_speaker else None


def hang_up(conn: Connection) -> None:
    """Close `conn` so that the peer sees EOF now, even while a thread of ours is blocked reading it."""
    try:
        with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, ValueError, AttributeError):
        pass  # already closed, or not a socket
    try:
        conn.close()
    except OSError:
        pass


class RemoteEngine:
    """An `EngineHandle` (+ `info`, `voices`, `voice_encoder`, `voice_store`) over one connection to the host."""

    def __init__(self, conn: Connection, name: str = "frontend",
                 on_lost: Callable[[str], None] | None = None) -> None:
        """`on_lost(reason)`: called (on the reader thread) when the connection to the host is lost, before the
        turns in flight are failed: a cluster replica's front end exits there, as its actor is gone."""
        self._conn = conn
        self._on_lost = on_lost
        hello = conn.recv()
        if not isinstance(hello, Hello):
            raise TypeError(f"engine host sent {type(hello).__name__} first, expected Hello")
        self._hello = hello
        self._status = hello.status
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # guards _sinks, _calls, _dead
        self._sinks: dict[str, Any] = {}
        self._calls: dict[int, Future] = {}
        self._ids = itertools.count()
        self._dead: str | None = None
        self._closing = False
        self._reader = threading.Thread(target=self._read, name=f"{name}-engine-reader", daemon=True)
        self._reader.start()

    @classmethod
    def connect(cls, address: str, authkey: bytes, name: str = "frontend",
                on_lost: Callable[[str], None] | None = None) -> RemoteEngine:
        return cls(Client(address, family="AF_UNIX", authkey=authkey), name, on_lost)

    # ---- EngineHandle ---------------------------------------------------------------------------------
    def submit(self, request: TurnRequest, sink) -> None:
        with self._lock:
            dead = self._dead
            if dead is None:
                self._sinks[request.turn_id] = sink
        if dead is not None:
            sink(TurnFailed(request.turn_id, f"engine unavailable: {dead}", FailureCode.ENGINE_UNAVAILABLE))
            return
        self._send(Submit(request))  # a lost connection fails the turn from the reader thread

    def confirm(self, turn_id: str) -> None:
        self._send(Confirm(turn_id))

    def discard(self, turn_id: str) -> None:
        with self._lock:
            self._sinks.pop(turn_id, None)  # a discarded turn ends without a terminal event
        self._send(Discard(turn_id))

    def cancel(self, turn_id: str) -> None:
        self._send(Cancel(turn_id))

    def close_conversation(self, conversation_id: str) -> None:
        self._send(Close(conversation_id))

    def health(self) -> EngineHealth:
        dead = self._dead
        return EngineHealth(False, dead) if dead is not None else self._status.health

    # ---- what RealtimeServer asks besides ---------------------------------------------------------------
    def info(self) -> dict:
        return dict(self._hello.info)

    def voices(self) -> list[str]:
        return list(self._hello.voices)

    def voice_encoder(self) -> RemoteVoiceEncoder | None:
        return RemoteVoiceEncoder(self) if self._hello.can_clone else None

    def voice_store(self) -> RemoteVoiceStore:
        return RemoteVoiceStore(self)

    def session_tickets(self) -> SessionTickets:
        return SessionTickets(self)

    def client_secrets(self) -> RemoteClientSecrets:
        return RemoteClientSecrets(self)

    def prompt_meter(self) -> RemotePromptMeter | None:
        """The engine process's `PromptMeter` (None when its engine has none)."""
        prompt = self._hello.info.get("prompt")
        return None if prompt is None else RemotePromptMeter(self, prompt["max_seq_len"], prompt["caption_budget"])

    def close(self) -> None:
        """Hang up (the host then cancels this front end's turns and closes its conversations)."""
        self._closing = True
        hang_up(self._conn)

    # ---- calls ------------------------------------------------------------------------------------------
    def call(self, method: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        """Run `method` on the host and return its result (re-raises its exception); blocks."""
        return self.call_future(method, *args).result(timeout_s)

    def call_future(self, method: str, *args: Any) -> Future:
        """Start `method` on the host; the future holds its result (or exception)."""
        future: Future = Future()
        call_id = next(self._ids)
        with self._lock:
            if self._dead is not None:
                future.set_exception(RuntimeError(f"engine unavailable: {self._dead}"))
                return future
            self._calls[call_id] = future
        future.add_done_callback(lambda _f: self._forget_call(call_id))
        self._send(Call(call_id, method, args))
        return future

    def _forget_call(self, call_id: int) -> None:
        with self._lock:
            self._calls.pop(call_id, None)

    # ---- the connection ------------------------------------------------------------------------------------
    def _send(self, message: object) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, ValueError) as exc:  # the host is gone: the reader sees EOF and fails everything
            if not self._closing:
                log.debug("engine connection: send failed (%s)", exc)

    def _read(self) -> None:
        reason = "engine process connection lost"
        try:
            while True:
                for item in self._conn.recv():
                    self._dispatch(item)
        except (EOFError, OSError):
            pass
        except BaseException as exc:  # a message that does not unpickle: the stream can no longer be trusted
            log.exception("engine connection: bad message")
            reason = f"engine connection broken: {exc!r}"
        if not self._closing and self._on_lost is not None:
            self._on_lost(reason)
        self._fail_all("front end closed" if self._closing else reason)

    def _dispatch(self, item: object) -> None:
        if isinstance(item, Status):
            self._status = item
            return
        if isinstance(item, Reply):
            with self._lock:
                future = self._calls.get(item.call_id)
            if future is not None and not future.done():
                future.set_result(item.value) if item.ok else future.set_exception(item.value)
            return
        turn_id = item.turn_id
        terminal = isinstance(item, TERMINAL)
        with self._lock:
            sink = self._sinks.pop(turn_id, None) if terminal else self._sinks.get(turn_id)
        if sink is None:
            return  # a discarded turn's late event
        try:
            sink(item)
        except Exception:  # the sink's bug costs its turn's event, never the reader
            log.exception("turn %s: event sink failed", turn_id)

    def _fail_all(self, reason: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = reason
            sinks, self._sinks = self._sinks, {}
            calls, self._calls = self._calls, {}
        if not self._closing:
            log.critical("engine unavailable: %s", reason)
        for future in calls.values():
            if not future.done():
                future.set_exception(RuntimeError(f"engine unavailable: {reason}"))
        for turn_id, sink in sinks.items():
            try:
                sink(TurnFailed(turn_id, f"engine unavailable: {reason}", FailureCode.ENGINE_UNAVAILABLE))
            except Exception:
                log.exception("turn %s: event sink failed", turn_id)


class SessionTickets:
    """`server.limits.max_sessions` across every front end: the engine host hands out one ticket per session
    (a front end that dies gives its tickets back with its connection)."""

    def __init__(self, engine: RemoteEngine) -> None:
        self._engine = engine

    async def acquire(self) -> bool:
        """True: the session may open (give the ticket back with `release`); False: at the global limit."""
        future = self._engine.call_future("acquire_session")
        try:
            return bool(await asyncio.shield(asyncio.wrap_future(future)))
        except RuntimeError:  # the engine process is gone: no session
            return False
        except asyncio.CancelledError:  # the handshake was cancelled: a ticket granted later goes back
            future.add_done_callback(lambda f: self.release() if not f.exception() and f.result() else None)
            raise

    def release(self) -> None:
        self._engine._send(Release())

    def total(self) -> int:
        """Sessions open on every front end (as of the host's last status, at most `HEARTBEAT_S` old)."""
        return self._engine._status.sessions


class RemotePromptMeter:
    """`PromptMeter` (engine/api.py) of the engine process: counts are taken there, by its tokenizers and cache."""

    def __init__(self, engine: RemoteEngine, max_seq_len: int, caption_budget: int) -> None:
        self._engine = engine
        self.max_seq_len = max_seq_len
        self.caption_budget = caption_budget

    def system_tokens(self, system, tools) -> int:
        return self._engine.call("system_tokens", system, tuple(tools), timeout_s=PROMPT_CALL_TIMEOUT_S)

    def caption_tokens(self, caption: str) -> int:
        return self._engine.call("caption_tokens", caption, timeout_s=PROMPT_CALL_TIMEOUT_S)


class RemoteVoiceEncoder:
    """`voice_prompt.VoiceEncoder.encode` run in the engine process; returns a `PromptRef`."""

    def __init__(self, engine: RemoteEngine) -> None:
        self._engine = engine

    def encode(self, wave, rate_hz: int, transcript: str, resample=None, *, check_length: bool = False) -> PromptRef:
        return self._engine.call("encode", np.asarray(wave, dtype=np.float32), rate_hz, transcript, resample,
                                 check_length)


class RemoteVoiceStore:
    """`voice_store.VoiceStore` of the engine process (one store for every front end)."""

    def __init__(self, engine: RemoteEngine) -> None:
        self._engine = engine

    def add(self, voice):
        return self._engine.call("add", voice)

    def get(self, owner: str, voice_id: str):
        return self._engine.call("get", owner, voice_id)

    def list(self, owner: str):
        return self._engine.call("list", owner)

    def delete(self, owner: str, voice_id: str) -> bool:
        return self._engine.call("delete", owner, voice_id)

    def __len__(self) -> int:
        return self._engine.call("count")

    @property
    def nbytes(self) -> int:
        return self._engine.call("nbytes")


class RemoteClientSecrets:
    """`client_secrets.ClientSecrets` of the engine process: an ephemeral key minted through one front end opens
    a session on any other (blocking round trips: the callers run them off the event loop)."""

    def __init__(self, engine: RemoteEngine) -> None:
        self._engine = engine

    def _call(self, method: str, *args: Any) -> Any:
        return self._engine.call(SECRETS_CALL_PREFIX + method, *args, timeout_s=SECRETS_TIMEOUT_S)

    def mint(self, owner, session, ttl_s: int):
        return self._call("mint", owner, dict(session), ttl_s)

    def peek(self, value: str):
        return self._call("peek", value)

    def redeem(self, value: str):
        return self._call("redeem", value)

    def revoke(self, owner, value: str) -> bool:
        return self._call("revoke", owner, value)

    def revoke_all(self, owner) -> int:
        return self._call("revoke_all", owner)
