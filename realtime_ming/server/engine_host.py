"""The engine process's side of `server.frontend_processes` >= 2: `EngineHost` serves one Engine to N front ends.

Each front end connects once (`multiprocessing.connection`, a unix socket with an auth key) and gets a
`_Peer`: a reader thread applies its commands to the engine (server/remote_engine.py has the wire types),
and a sender thread flushes its outbox. A turn's sink (called on the engine thread) only appends the
event to the outbox and wakes the sender: the engine thread never pickles and never blocks on a socket,
and a burst of events leaves in ONE message. The sender also sends the engine's health at least every
`HEARTBEAT_S`, so a dead engine is seen in every front end within a fraction of a second.

When a front end hangs up or dies, its peer cancels its turns (discards its unconfirmed speculative ones)
and closes its conversations: no KV slot outlives the process that owned it.

`VoiceHost` keeps the cloned voices (`VoiceStore`, with their CUDA tensors) for every front end; front
ends hold `PromptRef`s and the host puts the real voice into each `TurnRequest` it submits.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection, Listener
from typing import Any


from ..engine.api import FailureCode, TurnFailed, engine_health, engine_prompt_meter
from ..engine.voice_store import CustomVoice, VoiceStore
from .client_secrets import ClientSecrets
from .config import ClientSecretsConfig, VoicesConfig
from .remote_engine import (
    HEARTBEAT_S,
    PROMPT_CALLS,
    SECRETS_CALL_PREFIX,
    TERMINAL,
    Call,
    Cancel,
    Close,
    Confirm,
    Discard,
    Hello,
    PromptRef,
    Release,
    Reply,
    Status,
    Submit,
    hang_up,
)

__all__ = ["EngineHost", "VoiceHost"]

log = logging.getLogger(__name__)

_SECRET_CALLS = frozenset({"mint", "peek", "redeem", "revoke", "revoke_all"})

_RECENT_VOICES = 64  # evicted / deleted voices kept for sessions that already resolved them (their pins)
_PENDING_PROMPTS = 16  # encoded prompts waiting for their `add` (a front end that died in between leaks none)


def _ref(voice: CustomVoice) -> CustomVoice:
    """`voice` as a front end holds it: the prompt replaced by a `PromptRef`."""
    prompt = voice.prompt
    ref = PromptRef(voice.id, prompt.spk_embed is not None, prompt.num_patches, voice.nbytes)
    return dataclasses.replace(voice, prompt=ref)


class VoiceHost:
    """The cloned voices of every front end (the methods a front end's `Call` names). Thread-safe."""

    def __init__(self, cfg: VoicesConfig, encoder, owners: int = 1) -> None:
        self.store = VoiceStore(cfg.max_voices, cfg.max_voices_per_key, cfg.max_store_bytes, owners)
        self._encoder = encoder
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, object] = OrderedDict()  # PromptRef key -> VoicePrompt
        self._recent: OrderedDict[str, CustomVoice] = OrderedDict()  # no longer stored, maybe still pinned

    def encode(self, wave, rate_hz: int, transcript: str, resample, check_length: bool) -> PromptRef:
        from ..engine.voice_prompt import voice_prompt_bytes

        prompt = self._encoder.encode(wave, rate_hz, transcript, resample, check_length=check_length)
        key = secrets.token_urlsafe(12)
        with self._lock:
            self._pending[key] = prompt
            while len(self._pending) > _PENDING_PROMPTS:
                self._pending.popitem(last=False)
        return PromptRef(key, prompt.spk_embed is not None, prompt.num_patches, voice_prompt_bytes(prompt))

    def add(self, voice: CustomVoice) -> list[CustomVoice]:
        with self._lock:
            prompt = self._pending.pop(voice.prompt.key, None)
        if prompt is None:
            raise ValueError("the encoded voice expired before it was stored; register it again")
        evicted = self.store.add(dataclasses.replace(voice, prompt=prompt))
        self._remember(evicted)
        return [_ref(v) for v in evicted]

    def get(self, owner: str, voice_id: str) -> CustomVoice | None:
        voice = self.store.get(owner, voice_id)
        return None if voice is None else _ref(voice)

    def list(self, owner: str) -> list[CustomVoice]:
        return [_ref(v) for v in self.store.list(owner)]

    def delete(self, owner: str, voice_id: str) -> bool:
        voice = self.store.get(owner, voice_id)
        if voice is None or not self.store.delete(owner, voice_id):
            return False
        self._remember([voice])
        return True

    def count(self) -> int:
        return len(self.store)

    def nbytes(self) -> int:
        return self.store.nbytes

    def resolve(self, voice: CustomVoice) -> CustomVoice | None:
        """The real voice behind a front end's record (same id and owner), or None when it is gone."""
        with self._lock:
            found = self.store._voices.get(voice.id) or self._recent.get(voice.id)  # no LRU touch: a turn is no use
        return found if found is not None and found.owner == voice.owner else None

    def _remember(self, voices: list[CustomVoice]) -> None:
        with self._lock:
            for voice in voices:
                self._recent[voice.id] = voice
            while len(self._recent) > _RECENT_VOICES:
                self._recent.popitem(last=False)


class _Peer:
    """One front end's connection: its reader (commands) and sender (batched events) threads."""

    def __init__(self, host: EngineHost, conn: Connection, name: str) -> None:
        self.host, self.conn, self.name = host, conn, name
        self._cond = threading.Condition(threading.Lock())
        self._outbox: list = []
        self._closed = False
        self._turns: dict[str, bool] = {}  # turn id -> unconfirmed speculative (discard it, not cancel)
        self._conversations: set[str] = set()
        self._sent: Status | None = None
        self.sessions = 0  # tickets this front end holds (the host's lock)
        self.reader = threading.Thread(target=self._read, name=f"{name}-commands", daemon=True)
        self.sender = threading.Thread(target=self._send_loop, name=f"{name}-events", daemon=True)

    def start(self) -> None:
        self.sender.start()
        self.reader.start()

    def post(self, item: object) -> None:
        """Queue `item` for the front end (engine thread: an append and a notify, never I/O)."""
        with self._cond:
            if isinstance(item, TERMINAL):
                self._turns.pop(item.turn_id, None)
            self._outbox.append(item)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        hang_up(self.conn)

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                if not self._outbox and not self._closed:
                    self._cond.wait(HEARTBEAT_S)
                if self._closed:
                    return
                batch, self._outbox = self._outbox, []
            status = self.host.status()
            if status != self._sent or not batch:
                batch.append(status)  # a heartbeat, or news
                self._sent = status
            try:
                self.conn.send(batch)
            except (OSError, ValueError):
                return  # the front end is gone; the reader cleans up

    def _read(self) -> None:
        engine = self.host.engine
        try:
            while True:
                match self.conn.recv():
                    case Submit(request=request):
                        self._submit(request)
                    case Confirm(turn_id=turn_id):
                        with self._cond:
                            if turn_id in self._turns:
                                self._turns[turn_id] = False
                        engine.confirm(turn_id)
                    case Discard(turn_id=turn_id):
                        with self._cond:
                            self._turns.pop(turn_id, None)
                        engine.discard(turn_id)
                    case Cancel(turn_id=turn_id):
                        engine.cancel(turn_id)
                    case Close(conversation_id=conversation_id):
                        self._conversations.discard(conversation_id)
                        engine.close_conversation(conversation_id)
                    case Release():
                        self.host.release_session(self)
                    case Call(method="acquire_session", call_id=call_id):
                        self.post(Reply(call_id, True, self.host.acquire_session(self)))
                    case Call() as call:  # encodings on their own threads: store calls never wait behind one
                        pool = self.host.encodes if call.method == "encode" else self.host.calls
                        pool.submit(self._answer, call)
                    case other:
                        log.error("%s: unknown command %r; ignored", self.name, type(other).__name__)
        except (EOFError, OSError):
            pass
        except Exception:
            log.exception("%s: bad command; hanging up", self.name)
        self._hang_up()

    def _submit(self, request) -> None:
        voice = request.voice
        if isinstance(voice, CustomVoice):
            real = self.host.voices.resolve(voice) if self.host.voices is not None else None
            if real is None:
                self.post(TurnFailed(request.turn_id, f"voice {voice.id} is no longer registered",
                                     FailureCode.INVALID_PROMPT))
                return
            request = dataclasses.replace(request, voice=real)
        with self._cond:
            self._turns[request.turn_id] = request.speculative
        self._conversations.add(request.conversation_id)
        self.host.engine.submit(request, self.post)

    def _answer(self, call: Call) -> None:
        try:
            extra = self.host.peer_calls.get(call.method)
            if extra is not None:  # a call the host's owner added (a cluster replica's leases, front-end reports)
                self.post(Reply(call.call_id, True, extra(self.name, *call.args)))
                return
            if call.method in PROMPT_CALLS and self.host.meter is not None:  # a session's prompt measurement
                self.post(Reply(call.call_id, True, getattr(self.host.meter, call.method)(*call.args)))
                return
            if call.method.startswith(SECRETS_CALL_PREFIX):  # the one client-secret store of every front end
                name = call.method[len(SECRETS_CALL_PREFIX):]
                if name not in _SECRET_CALLS:
                    raise RuntimeError(f"no client-secret call {name!r}")
                method = getattr(self.host.secrets, name)
            else:
                method = getattr(self.host.voices, call.method) if self.host.voices is not None else None
            if method is None or call.method.startswith("_") or call.method == "resolve":
                raise RuntimeError(f"no voice call {call.method!r} on this engine")
            reply = Reply(call.call_id, True, method(*call.args))
        except Exception as exc:  # the front end re-raises it (VoicePromptTooLong, ValueError, ...)  # noqa: BLE001
            reply = Reply(call.call_id, False, exc)
        self.post(reply)

    def _hang_up(self) -> None:
        """The front end is gone: end its turns and free its conversations' KV slots."""
        engine = self.host.engine
        with self._cond:
            turns, self._turns = self._turns, {}
        for turn_id, speculative in turns.items():
            (engine.discard if speculative else engine.cancel)(turn_id)
        for conversation_id in self._conversations:
            engine.close_conversation(conversation_id)
        if turns or self._conversations:
            log.warning("%s hung up: %d turn(s) ended, %d conversation(s) closed", self.name, len(turns),
                        len(self._conversations))
        self._conversations = set()
        self.close()
        self.host.forget(self)  # and its session tickets
        for hook in self.host.hang_up_hooks:
            try:
                hook(self.name)
            except Exception:
                log.exception("%s: hang-up hook failed", self.name)


class EngineHost:
    """Accepts front ends on a unix socket and serves `engine` to each (start with `start()`)."""

    def __init__(self, engine, address: str, authkey: bytes, voices_cfg: VoicesConfig, max_sessions: int,
                 secrets_cfg: ClientSecretsConfig | None = None, voice_owners: int = 1) -> None:
        """`voice_owners`: the configured API keys (each gets its quota of the voice store)."""
        self.engine = engine
        self.secrets = ClientSecrets(secrets_cfg or ClientSecretsConfig())
        self.max_sessions = max_sessions
        self._sessions = 0
        self.address = address
        self.authkey = authkey
        self._listener = Listener(address, family="AF_UNIX", authkey=authkey)
        encoder_of = getattr(engine, "voice_encoder", None)
        encoder = encoder_of() if callable(encoder_of) else None
        self.voices = VoiceHost(voices_cfg, encoder, voice_owners) if encoder is not None else None
        self.meter = engine_prompt_meter(engine)
        self.encodes = ThreadPoolExecutor(voices_cfg.workers, thread_name_prefix="voice-clone")
        self.calls = ThreadPoolExecutor(2, thread_name_prefix="engine-host-call")
        self._lock = threading.Lock()
        self._peers: set[_Peer] = set()
        self._count = 0
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept, name="engine-host-accept", daemon=True)
        # The owner's extensions (a cluster replica's, cluster/replica_frontends.py), set before `start`:
        # calls a front end may make, answered on the call threads as `fn(peer_name, *args)`, and what runs
        # (on the peer's reader thread) once a front end hung up or died, with its name.
        self.peer_calls: dict[str, Callable[..., Any]] = {}
        self.hang_up_hooks: list[Callable[[str], None]] = []

    def start(self) -> None:
        self._acceptor.start()

    @property
    def peers(self) -> int:
        with self._lock:
            return len(self._peers)

    def forget(self, peer: _Peer) -> None:
        with self._lock:
            self._peers.discard(peer)
            self._sessions -= peer.sessions
            peer.sessions = 0

    def acquire_session(self, peer: _Peer) -> bool:
        """A session ticket for `peer` unless every front end together is at `max_sessions`."""
        with self._lock:
            if self._sessions >= self.max_sessions or peer not in self._peers:
                return False
            self._sessions += 1
            peer.sessions += 1
            return True

    def release_session(self, peer: _Peer) -> None:
        with self._lock:
            if peer.sessions > 0:
                peer.sessions -= 1
                self._sessions -= 1

    def status(self) -> Status:
        return Status(engine_health(self.engine), self._sessions)

    @property
    def sessions(self) -> int:
        """Sessions open in all the front ends together."""
        return self._sessions

    def close(self) -> None:
        self._closed = True
        sock = getattr(getattr(self._listener, "_listener", None), "_socket", None)  # wake the blocked accept
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            peers = list(self._peers)
        for peer in peers:
            peer.close()
        self.encodes.shutdown(wait=False, cancel_futures=True)
        self.calls.shutdown(wait=False, cancel_futures=True)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except OSError:
                return  # closed
            except Exception as exc:  # a client with the wrong key (AuthenticationError) is refused, the host lives  # noqa: BLE001
                log.warning("engine host: refused a connection (%s)", exc)
                continue
            self._count += 1
            peer = _Peer(self, conn, f"frontend-conn-{self._count}")
            info = getattr(self.engine, "info", dict)()
            voices = tuple(getattr(self.engine, "voices", list)())
            try:
                conn.send(Hello(info, voices, self.voices is not None, self.status()))
            except (OSError, ValueError):
                continue
            with self._lock:
                self._peers.add(peer)
            peer.start()
