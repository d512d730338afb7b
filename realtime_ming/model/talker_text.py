"""Talker text front-end: the strings the talker synthesises for one text, and their subtitles.

Reproduces [MING] `BailingTalker2.omni_audio_generation`'s text loop (docs/model.md §5.11): the
per-character flush rules, `front/text_segment_cut.cut_text_by_semantic_length(text, 50)`, English
number normalisation (`number_en.py`), TalkerTN (identity unless given) and the `cache_position` /
subtitle bookkeeping of the yielded chunks. Checked against the `talker_text_front` fixture.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .number_en import normalize_numbers

__all__ = [
    "TextCut",
    "TalkerJob",
    "Subtitle",
    "SubtitleTracker",
    "audio_cap_reached",
    "cut_text_by_semantic_length",
    "has_valid_content",
    "is_chinese",
    "plan_talker_jobs",
    "semantic_length",
    "talker_job_texts",
]

_CJK_RE = re.compile(r"[\u4e00-\u9fff]")
_SEMANTIC_CJK_RE = re.compile(r"[\u4e00-\u9fa5]")
_LATIN_WORD_RE = re.compile(r"[a-zA-Z]+")
_SEMANTIC_UNIT_RE = re.compile(r"([\u4e00-\u9fa5]|[a-zA-Z]+|[^a-zA-Z\u4e00-\u9fa5]+)")
_SPEAKABLE_RE = re.compile(r"[a-zA-Z\u4e00-\u9fff1-9]")
_DECIMAL_DOT_RE = re.compile(r"(\d)\.(\d)")
_ABBREVIATION_DOT_RE = re.compile(r"([A-Z])\.([A-Z])")
_NOT_CONTENT = frozenset(string.punctuation + string.whitespace)
# The reference protects dots with this placeholder; its letters count as an extra Latin "word" in
# semantic_length, so "U.S.A." or "3.14" make a text longer than it looks (the fixture shows it).
_DOT_PLACEHOLDER = "##DOT##"
_SENTENCE_ENDS = ("。", "！", "？")
_FLUSH_MARKS = "！？。，!?"  # an element ending in one of these may flush the buffer
_ASCII_DIGITS = frozenset("0123456789")
_FIRST_FLUSH_MIN = 12  # elements buffered before the first flush
_LATER_FLUSH_MIN = 8  # ... and before every later one
_CHARS_PER_S_ZH = 6.07  # subtitle speed used to slice the streamed fragment's text
_CHARS_PER_S_EN = 16.0
_CAP_CHARS_PER_S = 16000 / 5818  # audio_cap_reached: characters the talker may take per second
_CAP_MIN_AUDIO_S = 2.0


def is_chinese(text: str) -> bool:
    """True when the text holds a CJK unified ideograph (U+4E00–U+9FFF)."""
    return _CJK_RE.search(text) is not None


def semantic_length(text: str) -> int:
    """Number of CJK characters plus number of Latin letter runs ("words")."""
    return len(_SEMANTIC_CJK_RE.findall(text)) + len(_LATIN_WORD_RE.findall(text))


def has_valid_content(text: str) -> bool:
    """True when some character is neither ASCII punctuation nor whitespace (full-width marks count)."""
    return any(ch not in _NOT_CONTENT for ch in text)


@dataclass(frozen=True)
class TextCut:
    """Result of `cut_text_by_semantic_length`: fragments and their (start, end) positions."""

    fragments: tuple[str, ...]
    positions: Mapping[int, tuple[int, int]]


def _append_fragment(fragments: list[str], new_text: str, max_len: int, min_tail: int) -> None:
    new_text = new_text.lstrip("，,:;" + string.whitespace)
    if not has_valid_content(new_text):
        return
    if not fragments:
        fragments.append(new_text)
        return
    last = fragments[-1]
    new_len = semantic_length(new_text)
    if semantic_length(last) + new_len > max_len:
        fragments.append(new_text)
    elif last.endswith(_SENTENCE_ENDS) and new_len < min_tail:
        fragments.append(new_text)  # a short tail after a full sentence starts its own fragment
    else:
        joins_latin = not last.endswith(" ") and re.match(r"[a-zA-Z0-9]", new_text) is not None
        fragments[-1] = last + (" " if joins_latin else "") + new_text


def _split_long_fragment(text: str, max_len: int) -> list[str]:
    if semantic_length(text) <= max_len:
        return [text]
    fragments: list[str] = []
    current = ""
    for unit in _SEMANTIC_UNIT_RE.findall(text):
        unit_len = semantic_length(unit)
        if semantic_length(current) + unit_len <= max_len:
            current += unit
            continue
        if current:
            fragments.append(current)
        if unit_len > max_len:
            fragments.append(unit)
            current = ""
        else:
            current = unit
    if current:
        fragments.append(current)
    return fragments


def _calibrate_positions(
    fragments: list[str], positions: dict[int, tuple[int, int]], original: str
) -> dict[int, tuple[int, int]]:
    # Quirk kept from the reference: `positions` is keyed by clause, not by fragment, and is only
    # consulted when a fragment (now holding full-width punctuation) is not found in the original.
    calibrated: dict[int, tuple[int, int]] = {}
    cursor = 0
    for idx, fragment in enumerate(fragments):
        found = original.find(fragment, cursor)
        if found == -1:
            found = original.replace(" ", "").find(fragment.replace(" ", ""), cursor)
            if found != -1:
                found += original[:found].count(" ")
        if found == -1:
            calibrated[idx] = positions.get(idx, (cursor, cursor + len(fragment)))
            continue
        calibrated[idx] = (found, found + len(fragment))
        cursor = found + len(fragment)
    return calibrated


def _split_marked(text: str, marks: str) -> list[tuple[str, int, int]]:
    """Pieces of `text` ending at each mark: (stripped piece, start, end) in `text` coordinates."""
    pieces = []
    start = 0
    for i, ch in enumerate(text):
        if ch in marks:
            pieces.append((text[start : i + 1].strip(), start, i + 1))
            start = i + 1
    if start < len(text):
        pieces.append((text[start:].strip(), start, len(text)))
    return pieces


def _clauses(sentence: str) -> list[tuple[str, tuple[int, int]]]:
    clauses: list[tuple[str, tuple[int, int]]] = []
    for clause, start, end in _split_marked(sentence, "，;；"):
        if clause and has_valid_content(clause):
            clauses.append((clause, (start, end)))
        elif clause and clauses:  # a punctuation-only clause joins the previous one
            prev, (prev_start, _) = clauses[-1]
            clauses[-1] = (prev + clause, (prev_start, end))
    return clauses


def cut_text_by_semantic_length(text: str, max_semantic_length: int = 50, min_tail_length: int = 5) -> TextCut:
    """Split a text into fragments of at most `max_semantic_length` (CJK chars + Latin words).

    Short texts come back whole (newlines become spaces). Longer ones are split at sentence ends
    after ASCII `.!?,` become full-width `。！？，`, then at clauses, merging short pieces.
    """
    if not has_valid_content(text):
        return TextCut((), {})
    processed = _DECIMAL_DOT_RE.sub(r"\1" + _DOT_PLACEHOLDER + r"\2", text)
    for _ in range(3):  # overlapping matches ("U.S.A") need repeated passes
        processed = _ABBREVIATION_DOT_RE.sub(r"\1" + _DOT_PLACEHOLDER + r"\2", processed)
    processed = processed.replace("\n", " ").replace("。，", "。")
    if semantic_length(processed) <= max_semantic_length:
        return TextCut((processed.replace(_DOT_PLACEHOLDER, "."),), {0: (0, len(text))})

    normalized = processed.replace(".", "。").replace("!", "！").replace("?", "？").replace(",", "，")
    sentences = _split_marked(normalized, "。！？")
    if sentences and not normalized.endswith(_SENTENCE_ENDS):
        tail, start, end = sentences[-1]
        sentences[-1] = (tail + "。", start, end)  # an unterminated last sentence gets a full stop

    fragments: list[str] = []
    positions: dict[int, tuple[int, int]] = {}
    for sentence, sent_start, _ in sentences:
        if not sentence:
            continue
        clauses = _clauses(sentence)
        i = 0
        while i < len(clauses):
            clause, (start, end) = clauses[i]
            clause_len = semantic_length(clause)
            if clause_len < min_tail_length and i + 1 < len(clauses):
                combined = clause + clauses[i + 1][0]
                if semantic_length(combined) <= max_semantic_length:
                    _append_fragment(fragments, combined, max_semantic_length, min_tail_length)
                    positions[len(positions)] = (sent_start + start, sent_start + clauses[i + 1][1][1])
                    i += 2
                    continue
            if clause_len > max_semantic_length:
                pieces = _split_long_fragment(clause, max_semantic_length)
                step = len(clause) // len(pieces)  # the reference spreads the positions evenly
                for j, piece in enumerate(pieces):
                    _append_fragment(fragments, piece, max_semantic_length, min_tail_length)
                    piece_start = sent_start + start + j * step
                    positions[len(positions)] = (piece_start, piece_start + len(piece))
            else:
                _append_fragment(fragments, clause, max_semantic_length, min_tail_length)
                positions[len(positions)] = (sent_start + start, sent_start + end)
            i += 1
    restored = [fragment.replace(_DOT_PLACEHOLDER, ".") for fragment in fragments]
    return TextCut(tuple(restored), _calibrate_positions(restored, positions, text))


@dataclass(frozen=True)
class TalkerJob:
    """One independent talker run: `text` is synthesised, `text_ori` is the fragment it came from."""

    index: int  # `count` in the reference: position among all fragments of the input
    text_ori: str
    text: str
    is_streamed: bool  # [MING] streams only the first fragment; later ones are generated whole
    chars_per_s: float  # subtitle speed for this fragment (zh 6.07, otherwise 16)


def _make_job(index: int, fragment: str, tn: Callable[[str], str] | None) -> TalkerJob:
    zh = is_chinese(fragment)
    text = fragment if zh else normalize_numbers(fragment)
    if tn is not None:
        text = tn(text)
    if text.startswith("，"):
        text = text[1:]
    return TalkerJob(index, fragment, text, index == 0, _CHARS_PER_S_ZH if zh else _CHARS_PER_S_EN)


def _last_char(elements: list[str]) -> str | None:
    # The reference indexes elements[-1][-1], which raises on the "" a newline can leave behind.
    return elements[-1][-1] if elements and elements[-1] else None


def plan_talker_jobs(text: str, max_length: int = 50, tn: Callable[[str], str] | None = None) -> list[TalkerJob]:
    """The talker runs [MING] makes for `text`, in order; `tn` is TalkerTN (None = identity).

    A plain string is iterated one character at a time (that is what the reference's regex tokeniser
    sees when handed a str). Buffered characters are flushed at `！？。，!?` once 12 elements are
    buffered (8 after the first fragment), at `.` under the same rule unless a digit precedes it, and
    at a newline under the same rule. Whatever is left is kept only if it has a letter, CJK or 1–9.
    """
    jobs: list[TalkerJob] = []
    buffer: list[str] = []

    def flush() -> None:
        for fragment in cut_text_by_semantic_length("".join(buffer), max_length).fragments:
            jobs.append(_make_job(len(jobs), fragment, tn))
        # With no fragment the reference would crash on its next append; dropping the buffer is our fix.
        buffer.clear()

    for ch in text:
        min_len = _FIRST_FLUSH_MIN if not jobs else _LATER_FLUSH_MIN
        is_long = len(buffer) >= min_len
        if ch == "\n":
            if buffer:
                if is_chinese("".join(buffer)):
                    if is_chinese(_last_char(buffer) or ""):
                        buffer.append("，")
                else:
                    # The reference appends "." only after a multi-character element ending in a letter;
                    # a one-character "\n" becomes "", which still counts as an element.
                    buffer.append("")
            if len(buffer) >= min_len:
                flush()
            continue
        after_digit = _last_char(buffer) in _ASCII_DIGITS
        ready = is_long and (ch in _FLUSH_MARKS or (ch == "." and not after_digit))
        buffer.append(ch)
        if ready:
            flush()
    if buffer and _SPEAKABLE_RE.search("".join(buffer)):
        flush()
    return jobs


def talker_job_texts(text: str, max_length: int = 50, tn: Callable[[str], str] | None = None) -> list[str]:
    """The strings the talker synthesises for `text` (the fixture's `tts_job_texts`)."""
    return [job.text for job in plan_talker_jobs(text, max_length, tn)]


@dataclass(frozen=True)
class Subtitle:
    """What [MING] yields with each audio chunk: a slice of `text_ori`, its position, the chunk length."""

    text: str
    position: tuple[int, int]  # inclusive character range, counted across all fragments
    duration_ms: float


class SubtitleTracker:
    """Reproduces the reference's `cache_position` bookkeeping over the jobs of one input.

    Call `start(job)` before a job's chunks, then `chunk(job, index, num_samples, sample_rate_hz)` for
    every chunk in order. For the streamed job the text is sliced by `chars_per_s`; other jobs report
    their whole fragment.
    """

    def __init__(self) -> None:
        self._last_end: int | None = None  # end of the most recently recorded position
        self._span = (0, -1)

    def start(self, job: TalkerJob) -> tuple[int, int]:
        """Record the job's span, (start, start + len(text_ori) - 1), right after the previous one."""
        start = 0 if self._last_end is None else self._last_end + 1
        self._span = (start, start + len(job.text_ori) - 1)
        self._last_end = self._span[1]
        return self._span

    def chunk(self, job: TalkerJob, index: int, num_samples: int, sample_rate_hz: int) -> Subtitle:
        """The subtitle for chunk `index` (0-based) of `job`, which holds `num_samples` samples."""
        duration_s = float(num_samples / sample_rate_hz)
        if not job.is_streamed:
            return Subtitle(job.text_ori, self._span, duration_s * 1000)
        length = len(job.text_ori)
        spoken = math.ceil(duration_s * job.chars_per_s)
        start = 0 if index == 0 else min(self._last_end + 1, length - 1)
        end = min(spoken + start, length) - 1
        self._last_end = end
        # Quirk: a one-character slice (start == end) is reported as empty text.
        text = "" if start == end else job.text_ori[start : end + 1]
        return Subtitle(text, (start, end), duration_s * 1000)


def audio_cap_reached(num_samples: int, sample_rate_hz: int, text: str) -> bool:
    """The reference's runaway guard: stop a job once its audio is > 2 s and ≥ len(text) / 2.75 s.

    Checked before each new chunk on the audio already produced; the chunk that trips it is dropped.
    """
    audio_s = num_samples / sample_rate_hz
    return num_samples > 0 and audio_s * _CAP_CHARS_PER_S >= len(text) and audio_s > _CAP_MIN_AUDIO_S
