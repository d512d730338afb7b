"""Segmenter stage: cuts the thinker's streamed text deltas into speakable segments for the talker.

Pure and clock-injected (every call takes `now_ms`; no threads, no wall clock). Policy "reference"
reproduces sglang-omni's streaming segmenter with its quirks (docs/model.md §7, fixture case `segmenter`);
policy "latency" releases a short first segment early, never cuts inside a word or after a common
abbreviation ("Dr.", "e.g."), and can hold the first segment briefly for a clause or sentence mark
(`first_mark_wait_ms`; bench/segmenter_policies.py measures the trade-off).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["POLICIES", "Segment", "SegmentOrigin", "Segmenter", "SegmenterConfig"]

POLICIES = ("reference", "latency")
# Policy-dependent defaults, used where the config leaves a field as None.
_POLICY_DEFAULTS = {
    "reference": {"min_tokens": 8, "first_min_tokens": 4, "first_max_wait_ms": 450.0},
    "latency": {"min_tokens": 4, "first_min_tokens": 3, "first_max_wait_ms": 300.0},
}

# reference: the end marks of sglang-omni's streaming_text.py.
_REFERENCE_END_MARKS = (".", "!", "?", "。", "！", "？", "；", ";")
# latency: marks that end a sentence or a clause, and closers that may follow them ('done."').
_SENTENCE_MARKS = frozenset(".!?;…。！？；")
_CLAUSE_MARKS = frozenset(",:、，：")
_CLOSERS = "\"'”’»)]}）】」』》〉"
_NUMBER_SEPARATORS = frozenset(".,:")  # after a digit these may continue a number ("3.14", "1,000")
_OPENERS = "\"'“‘«([{（【「『《〈"
# latency: a "." after one of these (lower-cased) or after a dotted run ("e.g.", "U.S.") or a single
# capital ("J.") ends an abbreviation, not a sentence. "No." stays a mark: it is a common whole reply.
_ABBREVIATIONS = frozenset({"dr", "mr", "mrs", "ms", "prof", "sr", "jr", "st", "vs", "etc", "approx", "fig", "inc", "ltd"})


@dataclass(frozen=True, slots=True)
class SegmenterConfig:
    """How deltas become segments. Tokens are whitespace words ("reference") or words + CJK characters.

    Fields left as None take the policy's default: reference 8 / 4 tokens / 450 ms (sglang-omni),
    latency 4 / 3 tokens / 300 ms.
    """

    policy: str = "reference"  # "reference" (sglang-omni, fixture-exact) | "latency"
    min_tokens: int | None = None  # a sentence end releases a later segment once it holds this many tokens
    max_tokens: int = 40  # hard cap: a segment never waits for more tokens than this
    first_min_tokens: int | None = None  # reference: timeout needs this many; latency: release at this many
    first_max_wait_ms: float | None = None  # ms after the first text before the first segment is forced out
    clause_min_tokens: int = 8  # latency: a clause mark (, : 、) releases a later segment at this many tokens
    # latency: for this many ms after the first text, the first segment leaves only at a sentence or clause
    # mark; after it, at first_min_tokens complete words (0 = no wait). Reference: must stay 0.
    first_mark_wait_ms: float = 0.0

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"segmenter.policy must be one of {POLICIES}, got {self.policy!r}")
        for name, value in _POLICY_DEFAULTS[self.policy].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)  # frozen: fill the default once, here
        for name in ("min_tokens", "max_tokens", "first_min_tokens", "clause_min_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"segmenter.{name} must be >= 1")
        if self.min_tokens > self.max_tokens:
            raise ValueError("segmenter.min_tokens must be <= segmenter.max_tokens")
        if self.first_min_tokens > self.max_tokens:
            raise ValueError("segmenter.first_min_tokens must be <= segmenter.max_tokens")
        if self.first_max_wait_ms < 0:
            raise ValueError("segmenter.first_max_wait_ms must be >= 0")
        if self.first_mark_wait_ms < 0:
            raise ValueError("segmenter.first_mark_wait_ms must be >= 0")
        if self.first_mark_wait_ms and self.policy != "latency":
            raise ValueError("segmenter.first_mark_wait_ms applies to policy 'latency' only (reference has no such rule)")


class SegmentOrigin(enum.Enum):
    """What released a segment: a text delta, an idle tick (first-segment timer) or the end of stream."""

    DELTA = "delta"
    TICK = "tick"
    FINISH = "finish"


@dataclass(frozen=True, slots=True)
class Segment:
    """One speakable piece of the answer, numbered from 0 in order of release."""

    segment_id: int
    text: str
    is_final: bool  # released by finish(); a stream whose text ran out earlier has no final segment
    origin: SegmentOrigin


def _reference_tokens(text: str) -> int:
    # sglang-omni's count: whitespace words, else characters. Text without spaces (Chinese) is one
    # token however long it is, so it is never cut before the end of the stream (fixture case 8).
    return len(text.split()) or len(text)


def _is_cjk(ch: str) -> bool:
    """CJK ideographs and kana: each character is one token and a boundary on both sides."""
    cp = ord(ch)
    return (
        0x3040 <= cp <= 0x30FF  # hiragana, katakana
        or 0x3400 <= cp <= 0x4DBF
        or 0x4E00 <= cp <= 0x9FFF
        or 0xF900 <= cp <= 0xFAFF
        or 0x20000 <= cp <= 0x3134F
    )


class _Unit(NamedTuple):
    """A complete piece of the buffer: a word-ish run or one CJK character."""

    end: int  # buffer offset just past the piece (a possible cut)
    num_tokens: int  # tokens from the buffer start up to and including this piece
    mark: str  # "sentence", "clause", "abbreviation" or "" (by the piece's last characters, closers ignored)


def _is_abbreviation(core: str) -> bool:
    """'Dr.', 'e.g.', 'U.S.', 'J.': a '.' that ends a shortened word, not a sentence."""
    if not core.endswith("."):
        return False
    stem = core[:-1].lstrip(_OPENERS)
    if not stem or not stem.replace(".", "").isalpha():
        return False  # "3." / "..." / "done!." are not abbreviations
    return "." in stem or stem.lower() in _ABBREVIATIONS or (len(stem) == 1 and stem.isupper())


def _mark_of(run: str) -> str:
    core = run.rstrip(_CLOSERS)
    last = core[-1:]
    if _is_abbreviation(core):
        return "abbreviation"
    if last in _SENTENCE_MARKS:
        return "sentence"
    if last in _CLAUSE_MARKS:
        return "clause"
    return ""


def _run_is_closed(run: str) -> bool:
    """A run at the end of an open stream is complete only if it ends in a mark that cannot go on."""
    core = run.rstrip(_CLOSERS)
    if not core or _mark_of(core) not in ("sentence", "clause"):
        return False  # "Hel" may become "Hello", '"' may open a quote, "Dr." has its name to come
    if core.endswith(".") and len(core.lstrip(_OPENERS)) == 2 and core.lstrip(_OPENERS)[0].isalpha():
        return False  # "a." may become "a.m.", "e." "e.g."
    return not (core[-1] in _NUMBER_SEPARATORS and core[-2:-1].isdigit())  # "3." may become "3.14"


def _complete_units(text: str, is_stream_end: bool) -> list[_Unit]:
    """Split `text` into complete units; a trailing run that could still grow is left out."""
    units: list[_Unit] = []
    num_tokens = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if _is_cjk(ch):
            num_tokens += 1
            i += 1
            units.append(_Unit(i, num_tokens, ""))
            continue
        j = i
        while j < n and not text[j].isspace() and not _is_cjk(text[j]):
            j += 1
        run = text[i:j]
        if j == n and not is_stream_end and not _run_is_closed(run):
            break
        if any(c.isalnum() for c in run):
            num_tokens += 1
        units.append(_Unit(j, num_tokens, _mark_of(run)))
        i = j
    return units


def _without_trailing_abbreviations(units: list[_Unit]) -> list[_Unit]:
    """A cut after "Mr." splits "Mr." | "Smith": word-count and timeout cuts go before it (or wait)."""
    end = len(units)
    while end and units[end - 1].mark == "abbreviation":
        end -= 1
    return units[:end]


def _first_cut(units: list[_Unit], cfg: SegmenterConfig, waited_ms: float) -> int | None:
    """latency, segment 0: the earliest mark after a word; else, once the mark wait is over, all complete
    words if there are first_min_tokens of them (or any, once first_max_wait_ms is over, or the cap)."""
    for unit in units:
        if unit.mark in ("sentence", "clause") and unit.num_tokens >= 1:
            return unit.end
    units = _without_trailing_abbreviations(units)
    if not units:
        return None
    num_tokens = units[-1].num_tokens
    if num_tokens >= cfg.max_tokens or (num_tokens >= 1 and waited_ms >= cfg.first_max_wait_ms):
        return units[-1].end
    if num_tokens >= cfg.first_min_tokens and waited_ms >= cfg.first_mark_wait_ms:
        return units[-1].end
    return None


def _later_cut(units: list[_Unit], cfg: SegmenterConfig) -> int | None:
    """latency, later segments: a sentence end (or a clause mark) late enough, else the hard cap."""
    for k, unit in enumerate(units):
        if unit.mark == "sentence" and unit.num_tokens >= cfg.min_tokens:
            return unit.end
        if unit.mark == "clause" and unit.num_tokens >= cfg.clause_min_tokens:
            return unit.end
        if unit.num_tokens >= cfg.max_tokens:
            # Absorb punctuation-only pieces that close this word ("end ..." stays together).
            while k + 1 < len(units) and units[k + 1].num_tokens == unit.num_tokens:
                k += 1
            return units[k].end
    return None


class Segmenter:
    """Per-turn segmenter state. Not thread-safe: one owner (the engine thread) calls it.

    `push` takes each thinker delta, `tick` is the idle check (call it at `deadline_ms()`, or at any
    time), `finish` ends the stream and flushes. Each returns the segments released, in order.
    """

    def __init__(self, config: SegmenterConfig | None = None) -> None:
        self.config = config if config is not None else SegmenterConfig()
        self._buffer = ""
        self._next_id = 0
        self._first_text_ms: float | None = None  # arrival of the oldest unreleased text
        self._is_finished = False

    @property
    def num_segments(self) -> int:
        """Segments released so far."""
        return self._next_id

    @property
    def is_finished(self) -> bool:
        return self._is_finished

    def push(self, delta: str, now_ms: float) -> list[Segment]:
        """Append a thinker text delta; raises RuntimeError after finish()."""
        if self._is_finished:
            raise RuntimeError("segmenter: push() after finish()")
        if not delta:
            return []
        if self._first_text_ms is None:
            self._first_text_ms = now_ms
        self._buffer += delta
        if self.config.policy == "reference":
            return self._reference_release(now_ms, SegmentOrigin.DELTA)
        return self._latency_release(now_ms, SegmentOrigin.DELTA)

    def tick(self, now_ms: float) -> list[Segment]:
        """Idle check: releases the first segment once its wait is over (`first_max_wait_ms`; latency
        also `first_mark_wait_ms`)."""
        if self._is_finished or self._next_id != 0 or self._first_text_ms is None:
            return []
        if self.config.policy == "reference":
            if not self._is_overdue(now_ms):
                return []
            # sglang-omni re-runs push("") from its 100 ms idle tick once the first segment is overdue.
            if _reference_tokens(self._buffer) < self.config.first_min_tokens:
                return []
            return self._reference_release(now_ms, SegmentOrigin.TICK)
        return self._latency_release(now_ms, SegmentOrigin.TICK)

    def finish(self, now_ms: float) -> list[Segment]:
        """End of stream: the remaining text becomes a final segment. Idempotent."""
        if self._is_finished:
            return []
        self._is_finished = True
        if self.config.policy == "reference":
            # Any leftover, even whitespace; nothing at all when the last segment took the whole buffer.
            return [self._release(len(self._buffer), True, SegmentOrigin.FINISH)] if self._buffer else []
        segments = self._latency_release(now_ms, SegmentOrigin.FINISH)
        if self._buffer.strip():
            segments.append(self._release(len(self._buffer), True, SegmentOrigin.FINISH))
        self._buffer = ""  # trailing whitespace is not worth a talker run
        return segments

    def deadline_ms(self) -> float | None:
        """When a tick could next release something (None: only more input or finish() can)."""
        if self._is_finished or self._next_id != 0 or self._first_text_ms is None:
            return None
        cfg = self.config
        if cfg.policy == "reference":
            has_enough = _reference_tokens(self._buffer) >= cfg.first_min_tokens
            return self._first_text_ms + cfg.first_max_wait_ms if has_enough else None
        units = _without_trailing_abbreviations(_complete_units(self._buffer, is_stream_end=False))
        num_tokens = units[-1].num_tokens if units else 0
        if num_tokens >= cfg.first_min_tokens:  # only the mark wait holds it (a tick may be due already)
            return self._first_text_ms + min(cfg.first_mark_wait_ms, cfg.first_max_wait_ms)
        return self._first_text_ms + cfg.first_max_wait_ms if num_tokens >= 1 else None

    def _is_overdue(self, now_ms: float) -> bool:
        return self._first_text_ms is not None and now_ms - self._first_text_ms >= self.config.first_max_wait_ms

    def _release(self, cut: int, is_final: bool, origin: SegmentOrigin, text: str | None = None) -> Segment:
        """Emit buffer[:cut] (or `text`) and keep buffer[cut:]; the kept text's clock starts now."""
        segment = Segment(self._next_id, self._buffer[:cut] if text is None else text, is_final, origin)
        self._next_id += 1
        self._buffer = self._buffer[cut:]
        return segment

    def _reference_release(self, now_ms: float, origin: SegmentOrigin) -> list[Segment]:
        cfg = self.config
        num_tokens = _reference_tokens(self._buffer)
        if num_tokens >= cfg.max_tokens:
            # One capped segment per call, even if the remainder is still over the cap.
            words = self._buffer.split()
            if len(words) <= cfg.max_tokens:  # exactly at the cap, or one long spaceless "token"
                segment = self._release(len(self._buffer), False, origin)
            else:  # the rest is re-joined with single spaces (its leading space is lost)
                segment = self._release(len(self._buffer), False, origin, " ".join(words[: cfg.max_tokens]))
                self._buffer = " ".join(words[cfg.max_tokens :])
            self._first_text_ms = now_ms if self._buffer else None
            return [segment]
        ends_sentence = self._buffer.rstrip().endswith(_REFERENCE_END_MARKS)
        first_is_due = self._next_id == 0 and num_tokens >= cfg.first_min_tokens and self._is_overdue(now_ms)
        if (num_tokens >= cfg.min_tokens and ends_sentence) or first_is_due:
            self._first_text_ms = None
            return [self._release(len(self._buffer), False, origin)]
        return []

    def _latency_release(self, now_ms: float, origin: SegmentOrigin) -> list[Segment]:
        is_stream_end = origin is SegmentOrigin.FINISH
        segments = []
        while True:
            units = _complete_units(self._buffer, is_stream_end)
            if self._next_id == 0:
                waited_ms = 0.0 if self._first_text_ms is None else now_ms - self._first_text_ms
                cut = _first_cut(units, self.config, waited_ms)
            else:
                cut = _later_cut(units, self.config)
            if cut is None:
                return segments
            segments.append(self._release(cut, False, origin))
            # The kept text waits from now; no deadline applies after the first segment anyway.
            self._first_text_ms = now_ms if self._buffer.strip() else None
