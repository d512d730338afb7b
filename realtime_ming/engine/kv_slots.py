"""The thinker's KV-slot manager: which conversation owns which cache slot, and which tokens it holds.

A slot is one row of the static `ThinkerKVCache`; its `ids` are the token ids whose K/V sit at cache
positions 0..len-1. A conversation keeps its slot between turns, so a new turn prefills only the tail
past the longest common prefix (`match_prefix`, backed off to a text token so no media block is
split). Slots not in use are reused least recently used first (free ones before cached ones).
`fork` starts a side request (e.g. a transcription of the user's audio) from a prefix another slot
already computed: the K/V rows are copied device-side, the side request prefills only what follows.

Engine thread only, except `peek` (a snapshot any thread may take as a hint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .api import EngineBusyError

__all__ = ["KVSlot", "KVSlotManager", "copy_kv_prefix"]


@dataclass
class KVSlot:
    index: int
    conversation_id: str | None = None
    ids: list = field(default_factory=list)  # token ids whose K/V sit at cache positions 0..len-1
    busy: str | None = None  # turn id using the slot
    last_used: int = 0


def copy_kv_prefix(cache, src: int, dst: int, length: int) -> None:
    """Copy cache positions 0..length-1 of slot `src` into slot `dst` (every layer, K and V), on the device."""
    cache.k[:, dst, :, :length].copy_(cache.k[:, src, :, :length])
    cache.v[:, dst, :, :length].copy_(cache.v[:, src, :, :length])


class KVSlotManager:
    """Slot allocation per conversation, LRU eviction, prefix matching, prefix forks.

    `copy` copies a slot's K/V prefix (`(src, dst, length)`): the cache's own on one device, the
    tensor-parallel proxy's on every rank."""

    def __init__(self, num_slots: int, copy: Callable[[int, int, int], None]):
        self.slots = [KVSlot(i) for i in range(num_slots)]
        self._copy = copy
        self._clock = 0

    def num_cached(self) -> int:
        return sum(1 for s in self.slots if s.conversation_id is not None)

    def peek(self, conversation_id: str) -> tuple:
        """The token ids a conversation's idle slot holds now (empty if none): a hint for the input processor,
        taken from any thread (a list copy is atomic under the GIL; a stale answer only costs work)."""
        for slot in list(self.slots):
            if slot.conversation_id == conversation_id and slot.busy is None:
                return tuple(slot.ids)
        return ()

    def acquire(self, conversation_id: str, keep: KVSlot | None = None) -> KVSlot:
        """The conversation's own idle slot, else a free one, else the least recently used idle one (emptied;
        never `keep`). Raises EngineBusyError when every slot is in use."""
        self._clock += 1
        own = [s for s in self.slots if s.conversation_id == conversation_id and s.busy is None]
        if own:
            slot = own[0]
        else:
            slot = self._victim(keep)
            slot.ids = []
        slot.conversation_id = conversation_id
        slot.last_used = self._clock
        return slot

    def _victim(self, keep: KVSlot | None) -> KVSlot:
        idle = [s for s in self.slots if s.busy is None and s is not keep]
        if not idle:
            raise EngineBusyError("engine busy: every thinker KV slot is in use")
        return min(idle, key=lambda s: (s.conversation_id is not None, s.last_used))  # free first, then LRU

    def close_conversation(self, conversation_id: str) -> None:
        """Forget the conversation's idle slots (a busy slot stays with its turn)."""
        for slot in self.slots:
            if slot.conversation_id == conversation_id and slot.busy is None:
                slot.conversation_id, slot.ids = None, []

    @staticmethod
    def match_prefix(held, ids, spans) -> int:
        """How many leading tokens of `ids` a slot holding `held` may keep: at least one token is left to
        prefill (its logits start the reply), and a media block is never split (restart at its start token)."""
        p = 0
        for a, b in zip(held, ids):
            if a != b:
                break
            p += 1
        p = min(p, len(ids) - 1)
        for span in spans:
            if span.start - 1 <= p < span.start + span.length:
                p = min(p, span.start - 1)
        return p

    def fork(self, source_conversation_id: str, conversation_id: str, ids: list, spans=()) -> tuple[KVSlot, int]:
        """A slot for `conversation_id` (a side request) holding the longest prefix of `ids` that the source
        conversation's slot holds (busy or not: positions below its current length are never rewritten while
        it generates), copied device-side. -> (the slot, the number of tokens it already holds). A source with
        no slot, or a shorter match than the side slot's own, is no fork: the plain `acquire` result."""
        source = None
        if source_conversation_id != conversation_id:  # the busy one first: it holds the newest tokens
            owned = [s for s in self.slots if s.conversation_id == source_conversation_id]
            source = max(owned, key=lambda s: (s.busy is not None, s.last_used), default=None)
        slot = self.acquire(conversation_id, keep=source)
        own = self.match_prefix(slot.ids, ids, spans) if slot.ids else 0
        if source is None or not source.ids:
            return slot, own
        shared = self.match_prefix(source.ids, ids, spans)
        if shared <= own:
            return slot, own
        self._copy(source.index, slot.index, shared)
        slot.ids = list(source.ids[:shared])
        return slot, shared
