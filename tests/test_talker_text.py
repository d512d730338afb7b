"""Talker text front-end against the `talker_text_front` fixture (official omni_audio_generation loop)."""

from __future__ import annotations

import json

import pytest
from conftest import fixtures_root

from realtime_ming.model.number_en import normalize_numbers
from realtime_ming.model.talker_text import (
    SubtitleTracker,
    audio_cap_reached,
    cut_text_by_semantic_length,
    plan_talker_jobs,
    semantic_length,
    talker_job_texts,
)

# Read at import (json only, no torch) because the records parametrise the fixture tests.
_META = json.loads((fixtures_root() / "cases" / "talker_text_front.json").read_text())
# The fixture's stand-in tts_job yields one 0.32 s chunk per job (README case 9).
_CHUNK_SAMPLES = 14112
_SAMPLE_RATE_HZ = 44100


def _ids(records):
    return [r["input"][:24] for r in records]


@pytest.mark.parametrize("record", _META["omni_audio_generation"], ids=_ids(_META["omni_audio_generation"]))
def test_fixture_talker_job_texts(record):
    """The strings handed to the talker equal the fixture's tts_job_texts."""
    assert talker_job_texts(record["input"]) == record["tts_job_texts"]


@pytest.mark.parametrize("record", _META["omni_audio_generation"], ids=_ids(_META["omni_audio_generation"]))
def test_fixture_talker_yields(record):
    """Subtitle slices, cache positions and durations equal the fixture's yields (one chunk per job)."""
    tracker = SubtitleTracker()
    yields = []
    for job in plan_talker_jobs(record["input"]):
        tracker.start(job)
        sub = tracker.chunk(job, 0, _CHUNK_SAMPLES, _SAMPLE_RATE_HZ)
        yields.append({"text_ori": sub.text, "cache_position": list(sub.position), "duration_ms": sub.duration_ms})
    assert yields == record["yields"]


@pytest.mark.parametrize("record", _META["omni_audio_generation"], ids=_ids(_META["omni_audio_generation"]))
def test_fixture_chunker_sees_characters(record):
    """The recorded chunker elements are the input's first characters (a str is iterated per character)."""
    shown = [e for e in record["chunker_elements"] if e != "..."]
    assert shown == list(record["input"][: len(shown)])


@pytest.mark.parametrize(
    "record", _META["cut_text_by_semantic_length_max50"], ids=_ids(_META["cut_text_by_semantic_length_max50"])
)
def test_fixture_cut_text_by_semantic_length(record):
    """Fragments, positions and semantic length equal the fixture's cut_text_by_semantic_length(text, 50)."""
    cut = cut_text_by_semantic_length(record["input"], 50)
    assert semantic_length(record["input"]) == record["semantic_length"]
    assert list(cut.fragments) == record["fragments"]
    assert {str(k): list(v) for k, v in cut.positions.items()} == record["positions"]


@pytest.mark.parametrize("record", _META["normalize_numbers"], ids=_ids(_META["normalize_numbers"]))
def test_fixture_normalize_numbers(record):
    """English number normalisation equals the fixture's normalize_numbers output."""
    assert normalize_numbers(record["input"]) == record["output"]


def test_normalize_numbers_named_denominators():
    """Halves and quarters are named and pluralised; other denominators stay singular ordinals."""
    assert normalize_numbers("1/2 3/2 1/4 3/4 2/5") == "one half three halves one quarter three quarters two fifth"


def test_plan_talker_jobs_only_first_job_streamed():
    """Job indices count fragments across flushes and only the first one is streamed."""
    jobs = plan_talker_jobs("人工智能正在改变我们的生活方式，从智能手机上的语音助手到自动驾驶汽车，结束。")
    assert [(j.index, j.is_streamed) for j in jobs] == [(0, True), (1, False), (2, False)]
    # "结束。" has fewer than 8 elements at its "。", so it is the synthesised leftover.
    assert [j.text_ori for j in jobs] == ["人工智能正在改变我们的生活方式，", "从智能手机上的语音助手到自动驾驶汽车，", "结束。"]


def test_plan_talker_jobs_applies_tn_and_strips_leading_comma():
    """TalkerTN runs after number normalisation and one leading '，' is removed from its output."""
    jobs = plan_talker_jobs("I have 2 cats.", tn=lambda t: "，" + t.upper())
    assert [j.text for j in jobs] == ["I HAVE TWO CATS."]


def test_plan_talker_jobs_drops_unspeakable_tail():
    """A leftover without letters, CJK or digits 1-9 is not synthesised."""
    assert talker_job_texts("0 ... ---") == []
    assert talker_job_texts("") == []


def test_plan_talker_jobs_contentless_flush_is_dropped():
    """A flush that yields no fragment (punctuation only) is discarded instead of breaking the loop."""
    assert talker_job_texts("%%%%%%%%%%%%!Hello there.") == ["Hello there."]


def test_subtitle_tracker_streamed_chunks_advance():
    """Later chunks of the streamed job continue after the previous slice and stop at the text end."""
    job = plan_talker_jobs("Hello there my friend.")[0]
    tracker = SubtitleTracker()
    assert tracker.start(job) == (0, 21)
    subs = [tracker.chunk(job, i, _CHUNK_SAMPLES, _SAMPLE_RATE_HZ) for i in range(5)]
    assert [s.position for s in subs] == [(0, 5), (6, 11), (12, 17), (18, 21), (21, 21)]
    assert [s.text for s in subs] == ["Hello ", "there ", "my fri", "end.", ""]


def test_audio_cap_reached_rule():
    """The runaway guard needs more than 2 s of audio and len(text) / 2.75 s of it."""
    text = "x" * 11  # 11 chars -> 11 / (16000 / 5818) = 4.0 s
    assert not audio_cap_reached(0, 100, text)
    assert not audio_cap_reached(399, 100, text)
    assert audio_cap_reached(400, 100, text)
    assert not audio_cap_reached(200, 100, "xx")  # 2.0 s is not more than 2 s
    assert audio_cap_reached(201, 100, "xx")
