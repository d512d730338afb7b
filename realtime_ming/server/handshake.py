"""What the opening handshake of `/v1/realtime` tells us: dialect, API key, subprotocol, Origin.

Server-side clients authenticate with `Authorization: Bearer <key>` (or Azure-style `api-key`);
browsers with the subprotocol `openai-insecure-api-key.<key>` next to `realtime` (the browser
WebSocket API cannot set headers). Beta clients send `OpenAI-Beta: realtime=v1` or offer
`openai-beta.realtime-v1` (docs/protocol.md §2, §7). Reading a request never raises: repeated credential headers are
recorded as ambiguous (always refused with 401), a malformed subprotocol
header as no subprotocols (websockets answers the upgrade with 400), and the key offered as a
subprotocol is never echoed back.
"""

from __future__ import annotations

import hmac
import http
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs

from websockets.exceptions import InvalidHeader
from websockets.headers import parse_subprotocol
from websockets.http11 import Request

from ..protocol.dialect import Dialect
from .config import AuthConfig

__all__ = ["HandshakeInfo", "Refusal", "check_access", "inspect_handshake", "select_subprotocol", "sideband_refusal"]

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
    ambiguous_key: bool = False  # the same credential sent more than once (two Authorization headers, ...)
    ambiguous_origin: bool = False  # more than one Origin header


@dataclass(frozen=True, slots=True)
class Refusal:
    """An HTTP refusal of the upgrade: status, body text and the metrics reason label."""

    status: http.HTTPStatus
    message: str
    reason: str


def _offered_subprotocols(request: Request) -> tuple[str, ...]:
    offered: list[str] = []
    try:
        for value in request.headers.get_all("Sec-WebSocket-Protocol"):
            offered.extend(parse_subprotocol(value))
    except InvalidHeader:  # websockets refuses the upgrade itself (400)
        return ()
    return tuple(offered)


def _api_keys(headers, offered: tuple[str, ...]) -> list[str]:
    """Every key of the first credential source present: Bearer, else api-key, else the subprotocol."""
    bearer = [v[7:].strip() for v in headers.get_all("Authorization") if v[:7].lower() == "bearer "]
    if bearer or headers.get_all("Authorization"):
        return bearer or [""]  # a non-Bearer Authorization is a credential that matches no key
    api_key = [v.strip() for v in headers.get_all("api-key")]
    if api_key:
        return api_key
    return [p[len(_KEY_SUBPROTOCOL_PREFIX) :] for p in offered if p.startswith(_KEY_SUBPROTOCOL_PREFIX)]


def inspect_handshake(request: Request) -> HandshakeInfo:
    """Read dialect, key, subprotocols, Origin and `?model=` from an upgrade request (never raises)."""
    headers = request.headers
    offered = _offered_subprotocols(request)
    beta_header = any(
        part.strip().lower() == "realtime=v1"
        for value in headers.get_all("OpenAI-Beta")
        for part in value.split(",")
    )
    dialect = Dialect.BETA if beta_header or _BETA_SUBPROTOCOL in offered else Dialect.GA
    keys = _api_keys(headers, offered)
    origins = headers.get_all("Origin")
    query = parse_qs(request.path.partition("?")[2].partition("#")[0])
    model = query.get("model", [None])[0]
    api_key = (keys[0] or None) if len(keys) == 1 else None
    return HandshakeInfo(
        dialect,
        api_key,
        offered,
        origins[0] if origins else None,
        model,
        ambiguous_key=len(keys) > 1,
        ambiguous_origin=len(origins) > 1,
    )


def sideband_refusal(request: Request) -> Refusal | None:
    """`?call_id=` asks to join a WebRTC call as its server-side (sideband) control channel, which this server does
    not offer: refused (400) rather than served as an unrelated new session."""
    if "call_id" not in parse_qs(request.path.partition("?")[2].partition("#")[0]):
        return None
    return Refusal(http.HTTPStatus.BAD_REQUEST, "call_id: joining a WebRTC call from a WebSocket (sideband control) "
                   "is not supported by this server; open a session of its own without call_id.\n", "sideband")


def select_subprotocol(offered: Sequence[str]) -> str | None:
    """The subprotocol to echo: `realtime` when offered, else the first non-key offer, else none.

    Browsers (and the openai SDKs in a browser) offer `realtime` next to the key, and Chromium
    aborts when it offered subprotocols and none comes back, so `realtime` is echoed. The
    `openai-insecure-api-key.<key>` offer is a secret and never echoed: offered alone, the reply
    carries no subprotocol (a non-browser client accepts that; a browser cannot send a key alone).
    """
    if _REALTIME_SUBPROTOCOL in offered:
        return _REALTIME_SUBPROTOCOL
    plain = [p for p in offered if not p.startswith(_KEY_SUBPROTOCOL_PREFIX)]
    return plain[0] if plain else None


def check_access(info: HandshakeInfo, auth: AuthConfig) -> Refusal | None:
    """None when the upgrade may proceed; else why not (403 Origin, 401 key)."""
    if auth.allowed_origins and (
        info.ambiguous_origin or (info.origin is not None and info.origin not in auth.allowed_origins)
    ):
        return Refusal(http.HTTPStatus.FORBIDDEN, "Origin not allowed.\n", "origin")
    if info.ambiguous_key:  # two Authorization (or api-key) headers: refused even when no keys are set
        return Refusal(http.HTTPStatus.UNAUTHORIZED, "Send exactly one API key.\n", "auth")
    if auth.api_keys:
        key = (info.api_key or "").encode()
        # Compare against every key (no early exit) so timing reveals nothing about which matched.
        matched = [hmac.compare_digest(key, k.encode()) for k in auth.api_keys]
        if not any(matched):
            return Refusal(http.HTTPStatus.UNAUTHORIZED, "Missing or invalid API key.\n", "auth")
    return None
