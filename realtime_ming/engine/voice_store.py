"""Voices cloned at run time: a bounded, per-owner LRU store of ready voice prompts.

A `CustomVoice` is what the talker needs to speak in a registered voice (its `VoicePrompt`, already on
the talker's device, and the transcript of the clip), computed once when the voice is registered.
`VoiceStore` keeps them bounded by count and by tensor bytes, as per-owner quotas within the store's
global bounds: with `owners` owners (the configured API keys) each gets its share, at most
min(`max_per_owner`, `max_voices` // owners) voices and `max_bytes` // owners bytes. A registration past
its owner's quota evicts that owner's least recently used voices (`get`, a session choosing the voice,
counts as a use); it never evicts another owner's. Should the quotas still not fit the store (more
owners than voices), a registration that would overfill it is refused (`VoiceStoreFull`). Every operation
takes the owner (a digest of the API key): a voice registered under one owner is invisible to every other.
Thread-safe.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict

from .api import CUSTOM_VOICE_PREFIX, CustomVoice

__all__ = ["CUSTOM_VOICE_PREFIX", "CustomVoice", "VoicePromptTooLong", "VoiceStore", "VoiceStoreFull", "new_voice_id"]


class VoicePromptTooLong(ValueError):
    """The transcript + prompt latents leave the talker too little room for the reply's text (raised by
    `voice_prompt.VoiceEncoder.encode`; defined here, without torch, so a front-end process can catch it)."""


class VoiceStoreFull(Exception):
    """The store holds its global bound and the new voice's owner has nothing of its own to evict."""


def new_voice_id() -> str:
    """A fresh, unguessable voice id (`voice_` + 24 url-safe characters)."""
    return CUSTOM_VOICE_PREFIX + secrets.token_urlsafe(18)


class VoiceStore:
    """At most `max_voices` voices holding at most `max_bytes` of tensors, split into per-owner quotas."""

    def __init__(self, max_voices: int, max_per_owner: int, max_bytes: int, owners: int = 1) -> None:
        if min(max_voices, max_per_owner, max_bytes) <= 0:
            raise ValueError("voice store bounds must be > 0")
        share = max(1, owners)
        self.max_voices, self.max_bytes = max_voices, max_bytes
        self.max_per_owner = max(1, min(max_per_owner, max_voices // share))  # an owner's quota of voices
        self.max_owner_bytes = max(1, max_bytes // share)  # ... and of bytes
        self._lock = threading.Lock()
        self._voices: OrderedDict[str, CustomVoice] = OrderedDict()  # id -> voice, least recently used first
        self._nbytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._voices)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def add(self, voice: CustomVoice) -> list[CustomVoice]:
        """Store `voice` (most recently used), evicting its owner's least recently used voices past the
        owner's quota; returns the evicted voices (all of that owner).

        Raises ValueError when the voice alone exceeds its owner's byte quota, `VoiceStoreFull` when the
        store is full without room its owner could free (only when the quotas oversubscribe the store).
        """
        if voice.nbytes > self.max_owner_bytes:
            raise ValueError(f"the voice takes {voice.nbytes} bytes; an API key's voices may hold at most "
                             f"{self.max_owner_bytes}")
        with self._lock:
            own = [v for v in self._voices.values() if v.owner == voice.owner]  # least recently used first
            own_bytes = sum(v.nbytes for v in own)
            drop = freed = 0  # the owner's oldest `drop` voices, `freed` bytes, make way
            while not self._fits(voice, len(own) - drop, own_bytes - freed, drop, freed):
                if drop == len(own):  # only other owners' voices fill the store: refused, never theirs evicted
                    raise VoiceStoreFull(f"the voice store is full ({len(self._voices)} voices, {self._nbytes} "
                                         "bytes), held by other API keys")
                freed += own[drop].nbytes
                drop += 1
            evicted = [self._drop(old.id) for old in own[:drop]]
            self._voices[voice.id] = voice
            self._nbytes += voice.nbytes
            self.evictions += len(evicted)
            return evicted

    def _fits(self, voice: CustomVoice, own: int, own_bytes: int, dropped: int, freed: int) -> bool:
        """Whether `voice` fits its owner's quota (holding `own` voices of `own_bytes`) and the store's bounds
        once `dropped` voices of `freed` bytes are gone (the caller holds the lock)."""
        return (own < self.max_per_owner and own_bytes + voice.nbytes <= self.max_owner_bytes
                and len(self._voices) - dropped < self.max_voices
                and self._nbytes - freed + voice.nbytes <= self.max_bytes)

    def get(self, owner: str, voice_id: str) -> CustomVoice | None:
        """The owner's voice `voice_id` (marked used), or None (unknown, evicted, or another owner's)."""
        with self._lock:
            voice = self._voices.get(voice_id)
            if voice is None or voice.owner != owner:
                return None
            self._voices.move_to_end(voice_id)
            return voice

    def list(self, owner: str) -> list[CustomVoice]:
        """The owner's voices, oldest registration first (not marked used)."""
        with self._lock:
            return sorted((v for v in self._voices.values() if v.owner == owner), key=lambda v: v.created_at)

    def delete(self, owner: str, voice_id: str) -> bool:
        """Remove the owner's voice; False when it has none of that id."""
        with self._lock:
            voice = self._voices.get(voice_id)
            if voice is None or voice.owner != owner:
                return False
            self._drop(voice_id)
            return True

    def _drop(self, voice_id: str) -> CustomVoice:
        voice = self._voices.pop(voice_id)
        self._nbytes -= voice.nbytes
        return voice
