"""Voices cloned at run time: a bounded, per-owner LRU store of ready voice prompts.

A `CustomVoice` is what the talker needs to speak in a registered voice (its `VoicePrompt`, already on
the talker's device, and the transcript of the clip), computed once when the voice is registered.
`VoiceStore` keeps them bounded by count (in all and per owner) and by tensor bytes, evicting the least
recently used; `get` (a session choosing the voice) counts as a use. Every operation takes the owner
(a digest of the API key): a voice registered under one owner is invisible to every other.
Thread-safe.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a store entry only holds the prompt: the front-end processes import this without torch
    from ..model.talker import VoicePrompt

__all__ = ["CUSTOM_VOICE_PREFIX", "CustomVoice", "VoicePromptTooLong", "VoiceStore", "new_voice_id"]

CUSTOM_VOICE_PREFIX = "voice_"  # GA custom voices: {"id": "voice_..."}


class VoicePromptTooLong(ValueError):
    """The transcript + prompt latents leave the talker too little room for the reply's text (raised by
    `voice_prompt.VoiceEncoder.encode`; defined here, without torch, so a front-end process can catch it)."""


def new_voice_id() -> str:
    """A fresh, unguessable voice id (`voice_` + 24 url-safe characters)."""
    return CUSTOM_VOICE_PREFIX + secrets.token_urlsafe(18)


@dataclass(frozen=True, eq=False)
class CustomVoice:
    """A registered voice: the talker's voice prompt and the transcript it was registered with."""

    id: str
    owner: str
    name: str
    prompt: VoicePrompt = field(repr=False)
    prompt_text: str
    duration_s: float
    nbytes: int
    created_at: int = field(default_factory=lambda: int(time.time()))

    def describe(self) -> dict:
        """The public record (OpenAI's `audio.voice` shape plus our fields)."""
        return {"id": self.id, "object": "audio.voice", "type": "audio_sample", "name": self.name,
                "created_at": self.created_at, "duration_s": round(self.duration_s, 3),
                "transcript": self.prompt_text, "speaker_embedding": self.prompt.spk_embed is not None}


class VoiceStore:
    """At most `max_voices` voices (`max_per_owner` per owner) holding at most `max_bytes` of tensors."""

    def __init__(self, max_voices: int, max_per_owner: int, max_bytes: int) -> None:
        if min(max_voices, max_per_owner, max_bytes) <= 0:
            raise ValueError("voice store bounds must be > 0")
        self.max_voices, self.max_per_owner, self.max_bytes = max_voices, max_per_owner, max_bytes
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
        """Store `voice` (most recently used) and evict past the bounds; returns the evicted voices.

        Raises ValueError when the voice alone exceeds `max_bytes`.
        """
        if voice.nbytes > self.max_bytes:
            raise ValueError(f"the voice takes {voice.nbytes} bytes; the store holds at most {self.max_bytes}")
        with self._lock:
            self._voices[voice.id] = voice
            self._nbytes += voice.nbytes
            evicted = []
            own = [v for v in self._voices.values() if v.owner == voice.owner]
            for old in own[: max(0, len(own) - self.max_per_owner)]:
                evicted.append(self._drop(old.id))
            while len(self._voices) > self.max_voices or self._nbytes > self.max_bytes:
                evicted.append(self._drop(next(iter(self._voices))))
            self.evictions += len(evicted)
            return evicted

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
