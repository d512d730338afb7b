"""Ephemeral keys (`ek_...`): the store behind `POST /v1/realtime/client_secrets`, and who may open a session.

An API key mints a secret for a browser (`secret_routes.py`); the secret opens a realtime session on either
transport (WebSocket `Authorization: Bearer` / subprotocol, `POST /v1/realtime/calls`) *as the minting key*:
the session sees that key's cloned voices and limits and starts with the session config the secret was minted
with. A secret expires after its TTL, opens one session when `single_use` (the default), and its owner can
revoke it. It cannot mint secrets or manage voices: only the realtime entry points take it.

The store keeps a SHA-256 digest of each value, never the value itself (a lookup by digest also takes no
time that depends on how much of a guess matched). It is thread-safe and its calls run off the event loop:
with `server.frontend_processes` >= 2 it is the engine process's (`remote_engine.RemoteClientSecrets`, one
store for every front end, as for cloned voices). `authorize` is the one access check of the realtime entry
points: Origin, then a secret (redeemed or only looked at), else the configured API keys (`handshake.check_access`).
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import http
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .config import AuthConfig, ClientSecretsConfig
from .handshake import HandshakeInfo, Refusal, check_access

__all__ = ["SECRET_PREFIX", "ClientSecrets", "Grant", "SecretStore", "SecretsFull", "authorize", "is_secret"]

SECRET_PREFIX = "ek_"
_VALUE_BYTES = 32  # 256 random bits, URL-safe base64: also a valid WebSocket subprotocol token


def is_secret(key: str | None) -> bool:
    """Whether `key` has the shape of an ephemeral key."""
    return key is not None and key.startswith(SECRET_PREFIX)


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class SecretsFull(Exception):
    """Too many outstanding secrets (all keys, or this key): the mint is refused (429)."""


@dataclass(slots=True)
class _Secret:
    owner: str | None  # the minting API key (None: a server without keys)
    session: Mapping[str, Any]  # the minted session config, as JSON (applied as the session's first update)
    expires_at: float  # epoch seconds


class SecretStore(Protocol):
    """What the server needs of a store (`ClientSecrets`, or the engine process's over a front end's channel)."""

    def mint(self, owner: str | None, session: Mapping[str, Any], ttl_s: int) -> tuple[str, int]: ...

    def peek(self, value: str) -> _Secret | None: ...

    def redeem(self, value: str) -> _Secret | None: ...

    def revoke(self, owner: str | None, value: str) -> bool: ...

    def revoke_all(self, owner: str | None) -> int: ...


@dataclass(frozen=True, slots=True)
class Grant:
    """Who a realtime session acts as: the API key (voices, limits) and, for an ephemeral key, its session."""

    api_key: str | None
    session: Mapping[str, Any] | None = None
    secret: str | None = None  # the ephemeral key that opened it


class ClientSecrets:
    """The outstanding ephemeral keys of this server process (bounded; expired ones are dropped as time passes)."""

    def __init__(self, cfg: ClientSecretsConfig, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self._clock = clock
        self._lock = threading.Lock()
        self._secrets: dict[str, _Secret] = {}  # digest -> secret
        self._expiry: list[tuple[float, str]] = []  # heap of (expires_at, digest)
        self._per_owner: dict[str | None, int] = {}

    def __len__(self) -> int:
        with self._lock:
            self._purge()
            return len(self._secrets)

    def mint(self, owner: str | None, session: Mapping[str, Any], ttl_s: int) -> tuple[str, int]:
        """A new secret for `owner` valid `ttl_s` seconds: (its value, expires_at epoch seconds). Raises SecretsFull."""
        with self._lock:
            return self._mint(owner, session, ttl_s)

    def _mint(self, owner: str | None, session: Mapping[str, Any], ttl_s: int) -> tuple[str, int]:
        self._purge()
        if len(self._secrets) >= self.cfg.max_secrets:
            raise SecretsFull(f"this server holds {self.cfg.max_secrets} outstanding client secrets; retry later")
        if self._per_owner.get(owner, 0) >= self.cfg.max_secrets_per_key:
            raise SecretsFull(f"this API key holds {self.cfg.max_secrets_per_key} outstanding client secrets; "
                              "revoke some or let them expire")
        value = SECRET_PREFIX + secrets.token_urlsafe(_VALUE_BYTES)
        expires_at = int(self._clock()) + ttl_s
        digest = _digest(value)
        self._secrets[digest] = _Secret(owner, session, float(expires_at))
        heapq.heappush(self._expiry, (float(expires_at), digest))
        self._per_owner[owner] = self._per_owner.get(owner, 0) + 1
        return value, expires_at

    def peek(self, value: str) -> _Secret | None:
        """The live secret `value`, left in place (None: unknown, expired, used or revoked)."""
        with self._lock:
            self._purge()
            return self._secrets.get(_digest(value))

    def redeem(self, value: str) -> _Secret | None:
        """The live secret `value`, spent when secrets are single use (None: unknown, expired, used or revoked)."""
        with self._lock:
            self._purge()
            digest = _digest(value)
            found = self._secrets.get(digest)
            if found is not None and self.cfg.single_use:
                self._drop(digest)
            return found

    def revoke(self, owner: str | None, value: str) -> bool:
        """Revoke `owner`'s secret `value`; False when it holds no such live secret."""
        with self._lock:
            self._purge()
            digest = _digest(value)
            found = self._secrets.get(digest)
            if found is None or found.owner != owner:
                return False
            self._drop(digest)
            return True

    def revoke_all(self, owner: str | None) -> int:
        """Revoke every live secret of `owner`; returns how many."""
        with self._lock:
            self._purge()
            mine = [d for d, s in self._secrets.items() if s.owner == owner]
            for digest in mine:
                self._drop(digest)
            return len(mine)

    def _drop(self, digest: str) -> None:
        secret = self._secrets.pop(digest, None)
        if secret is None:
            return
        left = self._per_owner[secret.owner] - 1
        if left:
            self._per_owner[secret.owner] = left
        else:
            del self._per_owner[secret.owner]

    def _purge(self) -> None:
        now = self._clock()
        while self._expiry and self._expiry[0][0] <= now:
            _, digest = heapq.heappop(self._expiry)
            self._drop(digest)  # no-op when it was redeemed or revoked already


async def authorize(info: HandshakeInfo, auth: AuthConfig, secrets_store: SecretStore | None, *,
                    redeem: bool) -> Grant | Refusal:
    """The access check of a realtime entry point: a Grant, or the Refusal to answer (403 Origin, 401 key).

    A key shaped like an ephemeral key that is not one of the configured API keys must be a live secret (even on
    a server without keys: a client that meant to use one learns it expired). `redeem` spends a single-use secret;
    without it the secret is only looked at (check first, redeem once the session is certain to open).
    """
    refusal = check_access(info, AuthConfig(allowed_origins=auth.allowed_origins))  # Origin, ambiguous keys
    if refusal is not None:
        return refusal
    key = info.api_key
    if is_secret(key) and key not in auth.api_keys:
        assert key is not None
        found = None
        if secrets_store is not None:
            found = await asyncio.to_thread(secrets_store.redeem if redeem else secrets_store.peek, key)
        if found is None:
            return Refusal(http.HTTPStatus.UNAUTHORIZED, "Invalid, expired, used or revoked ephemeral key.\n",
                           "ephemeral_key")
        return Grant(found.owner, found.session, key)
    refusal = check_access(info, auth)
    return refusal if refusal is not None else Grant(key)
