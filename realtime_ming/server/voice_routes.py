"""`/v1/realtime/voices`: register (POST), list (GET), read (GET /{id}) and delete (DELETE /{id}) cloned voices.

Authenticated exactly like the `/v1/realtime` upgrade (the same keys, the same headers: `Authorization:
Bearer`, `api-key`; an Origin outside `server.auth.allowed_origins` is refused). The voices belong to
the API key that registered them: the store is keyed by a digest of the key, and another key gets
`voice_not_found` (404) for them, as if they did not exist. Without configured keys (loopback) every
caller shares one owner.

A registration decodes and validates the upload, then computes the speaker embedding and the prompt
latents once, on `server.voices.workers` worker threads — never on the event loop or the engine
thread — and stores the result (`engine/voice_store.py`). Sessions then only look the voice up
(`lookup_for`): a reply in a cloned voice costs the talker what a preset costs.
The store calls run off the event loop: with `server.frontend_processes` >= 2 the store is the engine
process's (`remote_engine.RemoteVoiceStore`, a round trip each).
Fairness: a registration in progress counts against its API key (without keys: its client address) from
its head, `server.voices.max_pending_per_key` at once, and takes one of the server-wide `max_pending` slots only
from its first body byte, waiting for one in arrival order (first come, first served) while the others compute: a
key that opens connections and sends no body refuses itself (429) and no one else. The body, and the wait for a
slot, must end within `body_timeout_s` of the head (408 `request_timeout`; 429 when no slot came free in time).
The store gives each key a quota within its global bounds and never evicts one key's voice for another's
(`voice_store.VoiceStore`).
Errors are JSON `{"error": {"type", "code", "message", "param"}}` with a 4xx status (5xx only for a
model failure); the registration never takes the server or a session down.
"""

from __future__ import annotations

import asyncio
import hashlib
import http
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from ..engine.voice_store import (
    CUSTOM_VOICE_PREFIX,
    CustomVoice,
    VoicePromptTooLong,
    VoiceStore,
    VoiceStoreFull,
    new_voice_id,
)
from .config import AuthConfig, VoicesConfig
from .handshake import check_access, inspect_handshake
from .http import json_response, request_path
from .http_body import BodyConnection, BodyError
from .voice_upload import VoiceUploadError, decode_audio, parse_upload

if TYPE_CHECKING:  # the encoder runs where the models are: a front-end process never loads torch
    from ..engine.voice_prompt import VoiceEncoder

__all__ = ["VOICES_PATH", "VoiceRoutes", "voice_store"]

log = logging.getLogger(__name__)

VOICES_PATH = "/v1/realtime/voices"
_PINS_PER_SESSION = 4  # cloned voices a session keeps alive after resolving them (evictions spare them)


def _error(status: int, code: str, message: str, param: str | None = None) -> Response:
    return json_response(http.HTTPStatus(status), VoiceUploadError(status, code, message, param).body())


def _busy(message: str) -> Response:
    response = _error(429, "too_many_requests", message)
    response.headers["Retry-After"] = "1"
    return response


def voice_store(cfg: VoicesConfig, auth: AuthConfig) -> VoiceStore:
    """The store of `server.voices`, one quota per configured API key (one owner without keys)."""
    return VoiceStore(cfg.max_voices, cfg.max_voices_per_key, cfg.max_store_bytes, owners=len(auth.api_keys))


class VoiceRoutes:
    """The voice endpoints and the store behind them; `encoder()` is None when the engine has no talker."""

    def __init__(self, cfg: VoicesConfig, auth: AuthConfig, encoder: Callable[[], VoiceEncoder | None],
                 store: VoiceStore | None = None) -> None:
        """`store`: where the voices live (default: a new one in this process; a front end of
        `server.frontend_processes` passes the engine process's, `remote_engine.RemoteVoiceStore`)."""
        self.cfg = cfg
        self._auth = auth
        self._encoder = encoder
        self.store = store if store is not None else voice_store(cfg, auth)
        self._executor = ThreadPoolExecutor(cfg.workers, thread_name_prefix="voice-clone")
        self._slots = asyncio.Semaphore(cfg.max_pending)  # registrations past their first body byte, every key's
        self._pending_by_key: Counter[str] = Counter()  # registrations from their head on, per key (or address)

    @staticmethod
    def matches(path: str) -> bool:
        return path == VOICES_PATH or path.startswith(VOICES_PATH + "/")

    @staticmethod
    def owner(api_key: str | None) -> str:
        """The store's owner for an (already authenticated) API key: a digest, never the key itself."""
        return "" if api_key is None else hashlib.sha256(api_key.encode()).hexdigest()

    def lookup_for(self, api_key: str | None) -> Callable[[str], CustomVoice | None]:
        """A session's voice lookup: its key's voices; the last few it resolved stay usable after eviction."""
        owner = self.owner(api_key)
        pins: OrderedDict[str, CustomVoice] = OrderedDict()

        def lookup(voice_id: str) -> CustomVoice | None:
            voice = self.store.get(owner, voice_id) or pins.get(voice_id)
            if voice is not None:
                pins[voice_id] = voice
                pins.move_to_end(voice_id)
                while len(pins) > _PINS_PER_SESSION:
                    pins.popitem(last=False)
            return voice

        return lookup

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def respond(self, connection: ServerConnection, request: Request) -> Response:
        """The response to a request for `VOICES_PATH` or below (never raises)."""
        try:
            return await self._respond(connection, request)
        except Exception:  # a bug costs this request only
            log.exception("voice endpoint failed")
            return _error(500, "server_error", "The voice request failed on the server.")

    async def _respond(self, connection: ServerConnection, request: Request) -> Response:
        method = connection.http_method if isinstance(connection, BodyConnection) else getattr(request, "method", "GET")
        path = request_path(request.path)
        refusal = check_access(inspect_handshake(request), self._auth)
        if refusal is not None:
            code = "invalid_api_key" if refusal.status == http.HTTPStatus.UNAUTHORIZED else "origin_not_allowed"
            return _error(refusal.status, code, refusal.message.strip())
        if not self.cfg.enabled:
            return _error(404, "voice_cloning_disabled", "Voice cloning is disabled on this server (server.voices).")
        owner = self.owner(inspect_handshake(request).api_key)
        voice_id = path[len(VOICES_PATH) + 1 :] if path != VOICES_PATH else None
        if voice_id is None:
            if method == "POST":
                return await self._register(connection, request, owner)
            if method == "GET":
                listed = await asyncio.to_thread(self.store.list, owner)
                return json_response(http.HTTPStatus.OK, {"object": "list", "data": [v.describe() for v in listed]})
            return self._not_allowed("GET, POST")
        if "/" in voice_id or not voice_id.startswith(CUSTOM_VOICE_PREFIX):
            return _error(404, "voice_not_found", f"No voice {voice_id[:80]!r}.", "voice_id")
        if method == "GET":
            voice = await asyncio.to_thread(self.store.get, owner, voice_id)
            if voice is None:
                return _error(404, "voice_not_found", f"No voice {voice_id!r} for this API key.", "voice_id")
            return json_response(http.HTTPStatus.OK, voice.describe())
        if method == "DELETE":
            if not await asyncio.to_thread(self.store.delete, owner, voice_id):
                return _error(404, "voice_not_found", f"No voice {voice_id!r} for this API key.", "voice_id")
            return json_response(http.HTTPStatus.OK, {"id": voice_id, "object": "audio.voice.deleted", "deleted": True})
        return self._not_allowed("GET, DELETE")

    @staticmethod
    def _not_allowed(allow: str) -> Response:
        response = _error(405, "method_not_allowed", f"Allowed methods: {allow}.")
        response.headers["Allow"] = allow
        return response

    async def _register(self, connection: ServerConnection, request: Request, owner: str) -> Response:
        encoder = self._encoder()
        if encoder is None:
            return _error(503, "voice_cloning_unavailable", "This server runs no talker: it cannot clone voices.")
        if not isinstance(connection, BodyConnection):
            return _error(500, "server_error", "This server cannot read request bodies.")
        key = owner if self._auth.api_keys else f"address:{_address(connection)}"
        if self._pending_by_key[key] >= self.cfg.max_pending_per_key:
            return _busy(f"{self.cfg.max_pending_per_key} voice registrations of this API key are in progress; "
                         "retry when one has finished.")
        self._pending_by_key[key] += 1
        try:
            return await self._receive(connection, request, owner, encoder)
        finally:
            self._pending_by_key[key] -= 1
            if not self._pending_by_key[key]:
                del self._pending_by_key[key]

    async def _receive(self, connection: BodyConnection, request: Request, owner: str,
                       encoder: VoiceEncoder) -> Response:
        """The first body byte, a server-wide slot (first come, first served), the whole body, all within
        `body_timeout_s` of the head; then the computation, in the slot."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.body_timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                await connection.body_started()  # no server-wide slot is held before the first body byte
        except TimeoutError:
            return self._late("begin")
        try:
            async with asyncio.timeout_at(deadline):
                await self._slots.acquire()  # first come, first served
        except TimeoutError:
            return _busy("Too many voice registrations in progress; retry shortly.")
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    body = await connection.request_body()
            except TimeoutError:
                return self._late("arrive")
            except BodyError as exc:
                code = {411: "length_required", 413: "request_too_large"}.get(exc.status, "invalid_request")
                return _error(exc.status, code, exc.message)
            content_type = request.headers.get("Content-Type")
            voice = await loop.run_in_executor(self._executor, self._compute, encoder, body, content_type, owner)
        except VoiceUploadError as exc:
            return json_response(http.HTTPStatus(exc.status), exc.body())
        finally:
            self._slots.release()
        try:
            evicted = await asyncio.to_thread(self.store.add, voice)
        except ValueError as exc:
            return _error(413, "voice_too_large", str(exc), "audio_sample")
        except VoiceStoreFull as exc:
            return _error(409, "voice_store_full", f"{exc}; delete voices of this key or ask the operator to raise "
                          "server.voices.max_voices / max_store_bytes.")
        for old in evicted:
            log.info("voice store: evicted %s (its key's least recently used, past the key's quota)", old.id)
        log.info("voice %s registered (%.1f s, %d bytes)", voice.id, voice.duration_s, voice.nbytes)
        return json_response(http.HTTPStatus.OK, voice.describe())

    def _late(self, what: str) -> Response:
        return _error(408, "request_timeout", f"The request body did not {what} within {self.cfg.body_timeout_s:g} s "
                      "of its head (server.voices.body_timeout_s).")

    def _compute(self, encoder: VoiceEncoder, body: bytes, content_type: str | None, owner: str) -> CustomVoice:
        """Worker thread: parse, decode, validate, embed. Raises VoiceUploadError."""
        upload = parse_upload(body, content_type, self.cfg)
        audio = decode_audio(upload.audio, self.cfg)
        try:
            prompt = encoder.encode(audio.samples, audio.rate_hz, upload.transcript, check_length=True)  # soxr
        except VoicePromptTooLong as exc:
            raise VoiceUploadError(400, "voice_prompt_too_long", str(exc), "audio_sample") from None
        except (RuntimeError, ValueError) as exc:  # the models refused this input: the caller's problem
            log.warning("voice registration failed: %s", exc)
            raise VoiceUploadError(422, "voice_encoding_failed", f"The voice could not be computed: {exc}",
                                   "audio_sample") from None
        voice_id = new_voice_id()
        nbytes = getattr(prompt, "nbytes", None)  # a remote prompt (`remote_engine.PromptRef`) knows its size
        if nbytes is None:  # a prompt computed here, in the engine's process (torch is loaded)
            from ..engine.voice_prompt import voice_prompt_bytes

            nbytes = voice_prompt_bytes(prompt)
        return CustomVoice(voice_id, owner, upload.name or voice_id, prompt, upload.transcript, audio.duration_s,
                           nbytes)



def _address(connection: ServerConnection) -> str:
    """The client's IP address ("" when the transport does not say)."""
    peer = connection.transport.get_extra_info("peername") if connection.transport is not None else None
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""
