"""The engine's `PromptMeter` (engine/api.py): a session's fixed prompt parts measured in tokens, bounded and cached.

The system turn (instructions and tools, as `ThinkerTokenizer.system_ids` renders it) is encoded in pieces that
stop as soon as it passes the context, so megabytes of tools cost about a context's worth of encoding, not their
size; its ids are kept (least recently used out first) and reused by every turn that has the same system turn
(`InputProcessor`), so a session's tools are encoded once, not per turn, and never on the engine thread. The
talker caption (speech style) is counted in talker tokens against `TalkerRunnerConfig.caption_budget`.
Thread-safe: sessions measure on worker threads while the engine's input workers read the same cache.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

from ..model.tokenizer import PromptTooLong, ThinkerTokenizer
from .prompt_budget import ContextLengthExceeded

__all__ = ["PromptMeter"]


class PromptMeter:
    """Measures system turns (thinker tokens) and talker captions; keeps the ids of up to `max_entries` system turns.

    `talker_encode` (text -> talker ids) is None for an engine without a talker: captions then cost nothing.
    """

    def __init__(self, tokenizer: ThinkerTokenizer, talker_encode: Callable[[str], Sequence[int]] | None, *,
                 max_seq_len: int, caption_budget: int, max_entries: int = 128) -> None:
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.caption_budget = caption_budget
        self._talker_encode = talker_encode
        self._max_entries = max_entries
        self._systems: OrderedDict[tuple, tuple[int, ...] | int] = OrderedDict()  # key -> ids, or tokens when over
        self._captions: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        # the generation prompt (`<role>ASSISTANT</role>`) the system turn is measured with
        self._generation = len(tokenizer.build_prompt([], system_ids=()).input_ids)

    @staticmethod
    def _key(system: str | None, tools: Sequence[Mapping]) -> tuple:
        if not tools:
            return (system, None)
        digest = hashlib.blake2b(digest_size=16)
        for tool in tools:
            digest.update(json.dumps(tool, ensure_ascii=False).encode("utf-8", "surrogatepass"))
            digest.update(b"\0")
        return (system, digest.digest())

    def _remember(self, table: OrderedDict, key, value) -> None:
        with self._lock:
            table[key] = value
            table.move_to_end(key)
            while len(table) > self._max_entries:
                table.popitem(last=False)

    def _lookup(self, table: OrderedDict, key):
        with self._lock:
            value = table.get(key)
            if value is not None:
                table.move_to_end(key)
            return value

    def system_ids(self, system: str | None, tools: Sequence[Mapping] = ()) -> tuple[int, ...]:
        """The system turn's ids (cached); raises ContextLengthExceeded when it alone takes the whole context."""
        key = self._key(system, tools)
        found = self._lookup(self._systems, key)
        if found is None:
            try:
                found = tuple(self.tokenizer.system_ids(system, tools=tools, max_tokens=self.max_seq_len))
            except PromptTooLong as exc:
                found = exc.num_tokens
            self._remember(self._systems, key, found)
        if isinstance(found, int):
            raise ContextLengthExceeded(found, self.max_seq_len, "the instructions and tools alone fill the context")
        return found

    def system_tokens(self, system: str | None, tools: Sequence[Mapping] = ()) -> int:
        """Tokens of the system turn plus the generation prompt; above `max_seq_len`, where measuring stopped.

        Encodes first (bounded) and keys the cache only for a turn that fits: megabytes of tools are refused
        without being written out whole (the cache key is a digest of every tool's JSON)."""
        try:
            ids = tuple(self.tokenizer.system_ids(system, tools=tools, max_tokens=self.max_seq_len))
        except PromptTooLong as exc:
            return exc.num_tokens + self._generation
        self._remember(self._systems, self._key(system, tools), ids)
        return len(ids) + self._generation

    def caption_tokens(self, caption: str) -> int:
        """Talker tokens `caption` takes in a talker prompt (its text and the mark that closes it)."""
        if self._talker_encode is None:
            return 0
        found = self._lookup(self._captions, caption)
        if found is None:
            found = len(self._talker_encode(caption)) + 1
            self._remember(self._captions, caption, found)
        return found
