"""What the opening handshake of `/v1/realtime` tells us: dialect, API key, subprotocol, Origin.

Server-side clients authenticate with `Authorization: Bearer <key>` (or Azure-style `api-key`);
browsers with the subprotocol `openai-insecure-api-key.<key>`. Beta clients send
`OpenAI-Beta: realtime=v1` or offer `openai-beta.realtime-v1` (docs/protocol.md §2, §7).
"""

from __future__ import annotations

import hmac
import http
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from websockets.headers import parse_subprotocol
from websockets.http11 import Request

from ..protocol.dialect import Dialect
from .config import AuthConfig

__all__ = ["HandshakeInfo", "Refusal", "check_access", "inspect_handshake", "select_subprotocol"]

_KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
_BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
_REALTIME_SUBPROTOCOL = "realtime"


@dataclass(frozen=True, slots=True)
class HandshakeInfo:
    """The parts of an upgrade request the server acts on."""

    dialect: Dialect
    api_key: str | None
    subprotocols: tuple[str, ...]
    origin: str | None
    model: str | None  # the `model` query parameter (unknown query keys are ignored)


@dataclass(frozen=True, slots=True)
class Refusal:
    """An HTTP refusal of the upgrade: status, body text and the metrics reason label."""

    status: http.HTTPStatus
    message: str
    reason: str


def _offered_subprotocols(request: Request) -> tuple[str, ...]:
    offered: list[str] = []
    for value in request.headers.get_all("Sec-WebSocket-Protocol"):
        offered.extend(parse_subprotocol(value))
    return tuple(offered)


def inspect_handshake(request: Request) -> HandshakeInfo:
    """Read dialect, key, subprotocols, Origin and `?model=` from an upgrade request."""
    headers = request.headers
    offered = _offered_subprotocols(request)
    beta_header = any(
        part.strip().lower() == "realtime=v1"
        for value in headers.get_all("OpenAI-Beta")
        for part in value.split(",")
    )
    dialect = Dialect.BETA if beta_header or _BETA_SUBPROTOCOL in offered else Dialect.GA
    api_key = None
    authorization = headers.get("Authorization", "")
    if authorization[:7].lower() == "bearer ":
        api_key = authorization[7:].strip()
    elif "api-key" in headers:
        api_key = headers["api-key"].strip()
    else:
        for proto in offered:
            if proto.startswith(_KEY_SUBPROTOCOL_PREFIX):
                api_key = proto[len(_KEY_SUBPROTOCOL_PREFIX) :]
                break
    query = parse_qs(urlsplit(request.path).query)
    model = query.get("model", [None])[0]
    return HandshakeInfo(dialect, api_key or None, offered, headers.get("Origin"), model)


def select_subprotocol(offered: Sequence[str]) -> str | None:
    """Echo `realtime` when the client offered subprotocols (Chromium aborts otherwise).

    A client that offered some but not `realtime` gets its first non-key offer back: the
    server must pick one of the offered values, and a key should not be echoed.
    """
    if not offered:
        return None
    if _REALTIME_SUBPROTOCOL in offered:
        return _REALTIME_SUBPROTOCOL
    plain = [p for p in offered if not p.startswith(_KEY_SUBPROTOCOL_PREFIX)]
    return plain[0] if plain else offered[0]


def check_access(info: HandshakeInfo, auth: AuthConfig) -> Refusal | None:
    """None when the upgrade may proceed; else why not (403 Origin, 401 key)."""
    if auth.allowed_origins and info.origin is not None and info.origin not in auth.allowed_origins:
        return Refusal(http.HTTPStatus.FORBIDDEN, "Origin not allowed.\n", "origin")
    if auth.api_keys:
        key = (info.api_key or "").encode()
        # Compare against every key (no early exit) so timing reveals nothing about which matched.
        matched = [hmac.compare_digest(key, k.encode()) for k in auth.api_keys]
        if not any(matched):
            return Refusal(http.HTTPStatus.UNAUTHORIZED, "Missing or invalid API key.\n", "auth")
    return None
