"""`POST /v1/realtime/calls`: a WebRTC call on the server's one port (SDP offer in, SDP answer out).

The body is the offer itself (`Content-Type: application/sdp`, what OpenAI's browser SDKs send) or
`multipart/form-data` with an `sdp` part and an optional `session` part (JSON, a session config: the openai
SDKs' `calls.create`). Auth as the WebSocket: an API key (`Authorization: Bearer`) or an ephemeral key minted
by one, whose session config applies first (a `session` part then patches it). The session config is
checked before the offer is answered, and a single-use ephemeral key is spent only once the answer exists.
The answer is `201 Created` with `Location: /v1/realtime/calls/{call_id}`; the call then runs as one session
(counted against `max_sessions`, drained and closed with the server) until the peer leaves, the data
channel closes or `POST /v1/realtime/calls/{call_id}/hangup` (by the key that opened it) ends it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from .client_secrets import Grant, SecretStore, authorize
from .config import AuthConfig, ServerConfig
from .connection import InitialConfigError, MediaPath
from .cors import allow_origin, preflight
from .handshake import HandshakeInfo, inspect_handshake
from .http import ApiRefusal, answer_api, api_error, request_path
from .http_body import BodyConnection, BodyError, form_parts
from .transport import Transport

if TYPE_CHECKING:
    from ..rtc.call import Call

__all__ = ["CALLS_PATH", "CallRoutes"]

log = logging.getLogger(__name__)

CALLS_PATH = "/v1/realtime/calls"

Serve = Callable[..., Awaitable[None]]  # RealtimeServer.serve_session(transport, info, initial=, media=)
Preview = Callable[[list[Mapping[str, Any]], HandshakeInfo], Awaitable[dict]]


@dataclasses.dataclass(slots=True)
class _Open:
    call: Call
    owner: str | None
    task: asyncio.Task


class CallRoutes:
    """The calls endpoint and the calls in progress of one server."""

    def __init__(self, cfg: ServerConfig, secrets: SecretStore, *, serve: Serve, preview: Preview,
                 refusal: Callable[[], tuple[str, str] | None]) -> None:
        self._cfg = cfg.server.webrtc
        self._auth: AuthConfig = cfg.server.auth
        self._max_request = cfg.server.client_secrets.max_request_bytes
        self._secrets = secrets
        self._serve, self._preview, self._refusal = serve, preview, refusal
        self._calls: dict[str, _Open] = {}

    @staticmethod
    def matches(path: str) -> bool:
        return path == CALLS_PATH or path.startswith(CALLS_PATH + "/")

    @property
    def num_open(self) -> int:
        return len(self._calls)

    async def respond(self, connection: ServerConnection, request: Request) -> Response:
        """The response to a request for `CALLS_PATH` or below (never raises)."""
        method = connection.http_method if isinstance(connection, BodyConnection) else getattr(request, "method", "GET")
        path = request_path(request.path)
        hangup = path.endswith("/hangup") and path.count("/") == CALLS_PATH.count("/") + 2
        if path != CALLS_PATH and not hangup:
            return allow_origin(api_error(404, "not_found", "Not found."), request, self._auth)
        if method == "OPTIONS":
            return preflight(request, self._auth, "POST")
        if method != "POST":
            response = api_error(405, "method_not_allowed", "Allowed methods: POST.")
            response.headers["Allow"] = "POST"
        elif hangup:
            response = await answer_api(self._hang_up(request, path.split("/")[-2]), "The hangup failed on the server.")
        else:
            response = await answer_api(self._create(connection, request), "The call could not be set up on the server.")
        return allow_origin(response, request, self._auth)

    async def _grant(self, info: HandshakeInfo, *, redeem: bool) -> Grant:
        grant = await authorize(info, self._auth, self._secrets, redeem=redeem)
        if isinstance(grant, Grant):
            return grant
        code = "origin_not_allowed" if grant.status == http.HTTPStatus.FORBIDDEN else "invalid_api_key"
        raise ApiRefusal(grant.status, code, grant.message.strip())

    async def _create(self, connection: ServerConnection, request: Request) -> Response:
        if not self._cfg.enabled:
            raise ApiRefusal(404, "webrtc_disabled", "WebRTC calls are disabled on this server (server.webrtc.enabled).")
        info = inspect_handshake(request)
        grant = await self._grant(info, redeem=False)
        busy = self._refusal()
        if busy is not None:
            refused = ApiRefusal(503, *busy)
            refused.response.headers["Retry-After"] = "1"
            raise refused
        offer, session = await self._read_offer(connection, request)
        info = dataclasses.replace(info, api_key=grant.api_key)
        initial = [c for c in (grant.session, session) if c is not None]
        if initial:
            try:
                await self._preview(initial, info)
            except InitialConfigError as exc:
                detail = exc.error.error
                raise ApiRefusal(400, detail.code or "invalid_value", detail.message, detail.param) from None
        from ..rtc import call as rtc  # aiortc and PyAV load with the first call, not with every server

        try:
            call = await rtc.answer_offer(offer, ice_servers=self._cfg.ice_servers,
                                          connect_timeout_s=self._cfg.connect_timeout_s)
        except rtc.OfferError as exc:
            raise ApiRefusal(400, "invalid_offer", str(exc), "sdp") from None
        spent = grant.secret is not None and await asyncio.to_thread(self._secrets.redeem, grant.secret) is None
        if spent:  # used or revoked meanwhile
            await call.hang_up("ephemeral key no longer valid")
            raise ApiRefusal(401, "invalid_api_key", "Invalid, expired, used or revoked ephemeral key.")
        self._start(call, info, initial, grant.api_key)
        headers = Headers()
        headers["Content-Type"] = "application/sdp"
        headers["Location"] = f"{CALLS_PATH}/{call.id}"
        headers["Cache-Control"] = "no-store"
        body = call.answer_sdp.encode()
        headers["Content-Length"] = str(len(body))
        log.info("call %s answered (origin=%s)", call.id, info.origin)
        return Response(http.HTTPStatus.CREATED.value, http.HTTPStatus.CREATED.phrase, headers, body)

    async def _read_offer(self, connection: ServerConnection, request: Request) -> tuple[str, Mapping | None]:
        if not isinstance(connection, BodyConnection):
            raise ApiRefusal(500, "server_error", "This server cannot read request bodies.")
        try:
            body = await connection.request_body()
        except BodyError as exc:
            raise ApiRefusal(exc.status, "invalid_request", exc.message) from None
        if len(body) > self._max_request:
            raise ApiRefusal(413, "request_too_large", f"The request body is over {self._max_request} bytes.")
        content_type = request.headers.get("Content-Type", "")
        kind = content_type.split(";")[0].strip().lower()
        session = None
        if kind == "multipart/form-data":
            try:
                parts = {part.name: part for part in form_parts(body, content_type)}
                sdp = parts["sdp"].text() if "sdp" in parts else None
                raw = parts["session"].text() if "session" in parts else None
            except BodyError as exc:
                raise ApiRefusal(400, "invalid_multipart", exc.message) from None
            if sdp is None:
                raise ApiRefusal(400, "missing_required_parameter", "The form has no 'sdp' part.", "sdp")
            for name in sorted(set(parts) - {"sdp", "session"}):
                raise ApiRefusal(400, "unknown_parameter", f"Unknown parameter '{name}'.", name)
            if raw is not None:
                try:
                    session = json.loads(raw)
                except (ValueError, RecursionError):
                    raise ApiRefusal(400, "invalid_json", "The 'session' part is not valid JSON.", "session") from None
                if not isinstance(session, dict):
                    raise ApiRefusal(400, "invalid_type", "'session' must be an object.", "session")
        elif kind in ("application/sdp", "text/plain", ""):
            try:
                sdp = body.decode("utf-8")
            except UnicodeDecodeError:
                raise ApiRefusal(400, "invalid_offer", "The SDP offer is not UTF-8 text.", "sdp") from None
        else:
            raise ApiRefusal(415, "unsupported_media_type", "Send the offer as application/sdp or multipart/form-data "
                           f"(sdp, session), not {kind!r}.")
        if len(sdp.encode()) > self._cfg.max_offer_bytes:
            raise ApiRefusal(413, "offer_too_large", f"The SDP offer is over {self._cfg.max_offer_bytes} bytes.", "sdp")
        return sdp, session

    def _start(self, call: Call, info: HandshakeInfo, initial: list[Mapping], owner: str | None) -> None:
        async def serve() -> None:
            try:
                transport: Transport = call.transport
                media: MediaPath = call.media
                await self._serve(transport, info, initial=initial, media=media)
            except Exception:  # a bug costs this call only
                log.exception("call %s failed", call.id)
            finally:
                self._calls.pop(call.id, None)
                await call.hang_up(call.transport.reason or "session ended")
                log.info("call %s ended (%s)", call.id, call.transport.reason or "session ended")

        self._calls[call.id] = _Open(call, owner, asyncio.create_task(serve(), name=f"call-{call.id}"))

    async def _hang_up(self, request: Request, call_id: str) -> Response:
        info = inspect_handshake(request)
        grant = await self._grant(info, redeem=False)
        found = self._calls.get(call_id)
        if found is None or (found.owner != grant.api_key and self._auth.api_keys):
            raise ApiRefusal(404, "call_not_found", f"No call {call_id[:80]!r} in progress for this API key.", "call_id")
        await found.call.hang_up("hung up by the API")
        headers = Headers()
        headers["Content-Length"] = "0"
        return Response(http.HTTPStatus.OK.value, http.HTTPStatus.OK.phrase, headers, b"")

    async def close(self, timeout_s: float) -> None:
        """End every call (server shutdown) and wait for their sessions (bounded)."""
        calls = list(self._calls.values())
        await asyncio.gather(*(c.call.hang_up("server shutting down") for c in calls), return_exceptions=True)
        if calls:
            await asyncio.wait([c.task for c in calls], timeout=timeout_s)
