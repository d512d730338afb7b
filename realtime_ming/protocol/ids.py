"""Opaque, unique, prefixed ids for server events, sessions, items, responses, conversations, calls.

The prefixes follow `docs/protocol.md` §6; nothing parses the suffix.
"""

from __future__ import annotations

import secrets
from enum import StrEnum

__all__ = ["IdPrefix", "new_id"]

_SUFFIX_BYTES = 12  # 96 random bits: collisions are negligible across all sessions of a server


class IdPrefix(StrEnum):
    """The id families the server mints."""

    EVENT = "event_"
    SESSION = "sess_"
    ITEM = "item_"
    RESPONSE = "resp_"
    CONVERSATION = "conv_"
    CALL = "call_"


def new_id(prefix: IdPrefix) -> str:
    """Return a fresh id such as `item_3f9a…` (24 hex characters after the prefix)."""
    return prefix.value + secrets.token_hex(_SUFFIX_BYTES)
