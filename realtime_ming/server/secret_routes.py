"""`/v1/realtime/client_secrets`: mint (POST), revoke one (DELETE /{value}) or all (DELETE) ephemeral keys.

GA shape: `{"expires_after": {"anchor": "created_at", "seconds": N}, "session": {...}}` in (both optional),
`{"value": "ek_...", "expires_at": <epoch s>, "session": {<the session object>}}` out. The session config is
checked now exactly as the session will apply it (a bad voice, tool or format is a 400 naming its param),
and the returned session object is what `session.created` will show. Minting takes an API key (not an
ephemeral one): the secret acts as that key, its voices and limits (`client_secrets.py`).
"""

from __future__ import annotations

import asyncio
import http
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from .client_secrets import SecretsFull, SecretStore, is_secret
from .config import AuthConfig, ClientSecretsConfig
from .connection import InitialConfigError
from .cors import allow_origin, preflight
from .handshake import HandshakeInfo, check_access, inspect_handshake
from .http import ApiRefusal, answer_api, api_error, json_response, request_path
from .http_body import BodyConnection, BodyError

__all__ = ["CLIENT_SECRETS_PATH", "SecretRoutes", "read_json_body"]


CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"
_KEYS = frozenset({"expires_after", "session"})
_EXPIRY_KEYS = frozenset({"anchor", "seconds"})

Preview = Callable[[list[Mapping[str, Any]], HandshakeInfo], Awaitable[dict]]


def _bad(code: str, message: str, param: str | None = None, status: int = 400) -> ApiRefusal:
    return ApiRefusal(status, code, message, param)


async def read_json_body(connection: ServerConnection, max_bytes: int) -> Any:
    """The request's JSON body (None when empty); raises ApiRefusal (400, 411, 413)."""
    if not isinstance(connection, BodyConnection):
        raise _bad("server_error", "This server cannot read request bodies.", status=500)
    try:
        body = await connection.request_body()
    except BodyError as exc:
        code = {411: "length_required", 413: "request_too_large"}.get(exc.status, "invalid_request")
        raise _bad(code, exc.message, status=exc.status) from None
    if len(body) > max_bytes:
        raise _bad("request_too_large", f"The request body is over the limit of {max_bytes} bytes.", status=413)
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise _bad("invalid_json", "The request body is not valid JSON.") from None


class SecretRoutes:
    """The client-secret endpoints over the server's store; `preview(config, info)` checks a session config."""

    def __init__(self, cfg: ClientSecretsConfig, auth: AuthConfig, store: SecretStore, preview: Preview) -> None:
        self.cfg = cfg
        self._auth = auth
        self.store = store
        self._preview = preview

    @staticmethod
    def matches(path: str) -> bool:
        return path == CLIENT_SECRETS_PATH or path.startswith(CLIENT_SECRETS_PATH + "/")

    async def respond(self, connection: ServerConnection, request: Request) -> Response:
        """The response to a request for `CLIENT_SECRETS_PATH` or below (never raises)."""
        method = connection.http_method if isinstance(connection, BodyConnection) else getattr(request, "method", "GET")
        path = request_path(request.path)
        value = path[len(CLIENT_SECRETS_PATH) + 1:] if path != CLIENT_SECRETS_PATH else None
        allow = "POST, DELETE" if value is None else "DELETE"
        if method == "OPTIONS":
            return preflight(request, self._auth, allow)
        response = await answer_api(self._respond(connection, request, method, value, allow),
                                    "The client secret request failed on the server.")
        return allow_origin(response, request, self._auth)

    async def _respond(self, connection: ServerConnection, request: Request, method: str, value: str | None,
                       allow: str) -> Response:
        if method not in allow.split(", "):
            response = api_error(405, "method_not_allowed", f"Allowed methods: {allow}.")
            response.headers["Allow"] = allow
            return response
        info = inspect_handshake(request)
        if is_secret(info.api_key) and info.api_key not in self._auth.api_keys:
            raise _bad("invalid_api_key", "An ephemeral key cannot manage client secrets: use an API key.", status=401)
        refusal = check_access(info, self._auth)
        if refusal is not None:
            code = "invalid_api_key" if refusal.status == http.HTTPStatus.UNAUTHORIZED else "origin_not_allowed"
            raise _bad(code, refusal.message.strip(), status=refusal.status)
        if not self.cfg.enabled:
            raise _bad("client_secrets_disabled", "Client secrets are disabled on this server "
                       "(server.client_secrets.enabled).", status=404)
        if method == "DELETE":
            if value is None:
                count = await asyncio.to_thread(self.store.revoke_all, info.api_key)
                return json_response(http.HTTPStatus.OK, {"object": "realtime.client_secret.deleted", "deleted": count})
            if not await asyncio.to_thread(self.store.revoke, info.api_key, value):
                raise _bad("client_secret_not_found", "No live client secret with this value for this API key.",
                           "value", status=404)
            return json_response(http.HTTPStatus.OK, {"object": "realtime.client_secret.deleted", "deleted": True})
        return await self._mint(connection, info)

    async def _mint(self, connection: ServerConnection, info: HandshakeInfo) -> Response:
        body = await read_json_body(connection, self.cfg.max_request_bytes)
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise _bad("invalid_type", "The request body must be a JSON object.")
        for key in sorted(set(body) - _KEYS):
            raise _bad("unknown_parameter", f"Unknown parameter '{key}'.", key)
        ttl_s = self._ttl(body.get("expires_after"))
        session = body.get("session")
        if session is None:
            session = {"type": "realtime"}
        if not isinstance(session, dict):
            raise _bad("invalid_type", "'session' must be an object (a realtime session configuration).", "session")
        try:
            described = await self._preview([session], info)
        except InitialConfigError as exc:
            detail = exc.error.error
            raise _bad(detail.code or "invalid_value", detail.message, detail.param) from None
        try:
            value, expires_at = await asyncio.to_thread(self.store.mint, info.api_key, session, ttl_s)
        except SecretsFull as exc:
            refused = _bad("too_many_client_secrets", str(exc), status=429)
            refused.response.headers["Retry-After"] = "60"
            raise refused from None
        return json_response(http.HTTPStatus.OK, {"value": value, "expires_at": expires_at,
                                                  "session": {**described, "expires_at": expires_at}})

    def _ttl(self, expires_after: object) -> int:
        cfg = self.cfg
        if expires_after is None:
            return cfg.default_ttl_s
        if not isinstance(expires_after, dict):
            raise _bad("invalid_type", "'expires_after' must be an object.", "expires_after")
        for key in sorted(set(expires_after) - _EXPIRY_KEYS):
            raise _bad("unknown_parameter", f"Unknown parameter 'expires_after.{key}'.", f"expires_after.{key}")
        anchor = expires_after.get("anchor", "created_at")
        if anchor != "created_at":
            raise _bad("invalid_value", "'expires_after.anchor' must be 'created_at'.", "expires_after.anchor")
        seconds = expires_after.get("seconds", cfg.default_ttl_s)
        if not isinstance(seconds, int) or isinstance(seconds, bool):
            raise _bad("invalid_type", "'expires_after.seconds' must be an integer.", "expires_after.seconds")
        if not cfg.min_ttl_s <= seconds <= cfg.max_ttl_s:
            raise _bad("invalid_value", f"'expires_after.seconds' must be in [{cfg.min_ttl_s}, {cfg.max_ttl_s}], "
                       f"got {seconds}.", "expires_after.seconds")
        return seconds
