"""Streaming segmenter: sglang-omni replay against the `segmenter` fixture, and the latency policy rules."""

from __future__ import annotations

import json
import random

import pytest
from conftest import fixtures_root

from realtime_ming.engine.segmenter import Segment, SegmentOrigin, Segmenter, SegmenterConfig

# Read at import (json only) because the scenarios parametrise the fixture test.
_META = json.loads((fixtures_root() / "cases" / "segmenter.json").read_text())
_IDLE_TICK_MS = 100  # the reference polls its inbox with timeout=0.1 s


def _as_fixture_record(t_ms: float, segment: Segment, finish_origin: str) -> dict:
    # The fixture names the finishing message ("done" or "payload"); we call both FINISH.
    origin = {SegmentOrigin.DELTA: "chunk", SegmentOrigin.TICK: "tick", SegmentOrigin.FINISH: finish_origin}
    return {
        "t_ms": t_ms,
        "origin": origin[segment.origin],
        "segment_id": segment.segment_id,
        "is_final_segment": segment.is_final,
        "text_len_bytes": len(segment.text.encode("utf-8")),
        "text": segment.text,
    }


def _replay(events: list[dict]) -> list[dict]:
    """Drive a reference Segmenter with the fixture's virtual clock, recording what it releases."""
    segmenter = Segmenter(SegmenterConfig())
    emitted: list[dict] = []
    arrived: set[str] = set()
    last_message_ms = None
    for event in events:
        t_ms = event["t_ms"]
        if last_message_ms is not None:  # idle ticks strictly before this message
            tick_ms = last_message_ms + _IDLE_TICK_MS
            while tick_ms < t_ms:
                emitted += [_as_fixture_record(tick_ms, s, "") for s in segmenter.tick(tick_ms)]
                tick_ms += _IDLE_TICK_MS
        last_message_ms = t_ms
        if event["type"] == "chunk":
            emitted += [_as_fixture_record(t_ms, s, "") for s in segmenter.push(event["text"], t_ms)]
            continue
        arrived.add(event["type"])
        if arrived == {"done", "payload"}:  # the request is finalised once both have arrived
            emitted += [_as_fixture_record(t_ms, s, event["type"]) for s in segmenter.finish(t_ms)]
            result = {"segment_count": segmenter.num_segments, "aborted": False}
            emitted.append({"t_ms": t_ms, "origin": event["type"], "result": result})
    return emitted


def test_fixture_segmenter_config_matches_defaults():
    """The default config is the fixture's (sglang-omni stage factory) configuration."""
    cfg, ref = SegmenterConfig(), _META["config"]
    assert cfg.policy == "reference"
    assert (cfg.min_tokens, cfg.max_tokens) == (ref["segment_min_tokens"], ref["segment_max_tokens"])
    assert (cfg.first_min_tokens, cfg.first_max_wait_ms) == (
        ref["first_segment_min_tokens"],
        ref["first_segment_max_wait_ms"],
    )


@pytest.mark.parametrize("name", sorted(_META["scenarios"]))
def test_fixture_segmenter_scenario(name):
    """Replaying a scenario releases exactly the fixture's segments, times, origins and final result."""
    scenario = _META["scenarios"][name]
    assert _replay(scenario["events"]) == scenario["emitted"]


def test_reference_deadline_needs_first_min_tokens():
    """The reference deadline appears once the buffer holds 4 tokens and equals first text + 450 ms."""
    seg = Segmenter()
    seg.push("So", 10.0)
    seg.push(" um maybe", 20.0)
    assert seg.deadline_ms() is None
    seg.push(" we", 30.0)
    assert seg.deadline_ms() == 460.0
    assert seg.tick(459.0) == []
    assert seg.tick(460.0) == [Segment(0, "So um maybe we", False, SegmentOrigin.TICK)]
    assert seg.deadline_ms() is None


def test_reference_capped_push_releases_one_segment():
    """One delta over twice the cap releases a single 40-word segment; the rest waits for more input."""
    seg = Segmenter()
    out = seg.push(" ".join(f"w{i}" for i in range(90)), 0.0)
    assert [s.text for s in out] == [" ".join(f"w{i}" for i in range(40))]
    assert seg.finish(5.0) == [Segment(1, " ".join(f"w{i}" for i in range(40, 90)), True, SegmentOrigin.FINISH)]


def test_segmenter_empty_stream_releases_nothing():
    """Empty deltas and an immediate finish produce no segment, in both policies."""
    for policy in ("reference", "latency"):
        seg = Segmenter(SegmenterConfig(policy=policy))
        assert seg.push("", 0.0) == []
        assert seg.deadline_ms() is None
        assert seg.finish(1.0) == []
        assert seg.finish(2.0) == []


def test_segmenter_push_after_finish_raises():
    """Pushing into a finished segmenter is an error; ticks after finish are no-ops."""
    seg = Segmenter()
    seg.finish(0.0)
    with pytest.raises(RuntimeError):
        seg.push("late", 1.0)
    assert seg.tick(1000.0) == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"policy": "fast"}, "segmenter.policy"),
        ({"min_tokens": 0}, "segmenter.min_tokens"),
        ({"max_tokens": 4, "min_tokens": 5}, "segmenter.min_tokens"),
        ({"first_min_tokens": 50}, "segmenter.first_min_tokens"),
        ({"first_max_wait_ms": -1.0}, "segmenter.first_max_wait_ms"),
        ({"clause_min_tokens": 0}, "segmenter.clause_min_tokens"),
    ],
)
def test_segmenter_config_rejects_bad_values(kwargs, field):
    """Invalid config values raise ValueError naming the field."""
    with pytest.raises(ValueError, match=field):
        SegmenterConfig(**kwargs)


def test_segmenter_config_policy_defaults():
    """Unset first-segment fields take the policy's defaults; explicit values win."""
    latency = SegmenterConfig(policy="latency")
    assert (latency.min_tokens, latency.first_min_tokens, latency.first_max_wait_ms) == (4, 3, 300.0)
    assert SegmenterConfig(policy="latency", first_min_tokens=2).first_min_tokens == 2


def _latency(**kwargs) -> Segmenter:
    return Segmenter(SegmenterConfig(policy="latency", **kwargs))


def _texts(segments: list[Segment]) -> list[str]:
    return [s.text for s in segments]


def test_latency_never_cuts_inside_a_word():
    """A word split across deltas is released only once it is complete."""
    seg = _latency(first_min_tokens=2)
    assert seg.push("Hel", 0.0) == []
    assert seg.push("lo wor", 1.0) == []  # "Hello" complete, "wor" may still grow
    assert seg.push("ld", 2.0) == []
    assert _texts(seg.push(" and", 3.0)) == ["Hello world"]
    assert seg.finish(4.0) == [Segment(1, " and", True, SegmentOrigin.FINISH)]


def test_latency_first_segment_at_min_words():
    """The first segment leaves as soon as it has first_min_tokens complete words."""
    seg = _latency()
    assert seg.push("I", 0.0) + seg.push(" think", 1.0) + seg.push(" we", 2.0) == []
    assert _texts(seg.push(" should", 3.0)) == ["I think we"]


def test_latency_first_segment_at_clause_mark():
    """A clause mark after one word releases the first segment at once."""
    seg = _latency()
    assert seg.push("Well", 0.0) == []
    assert seg.push(",", 1.0) == [Segment(0, "Well,", False, SegmentOrigin.DELTA)]


def test_latency_number_separators_do_not_cut():
    """A '.' or ',' right after a digit at the buffer end waits: it may continue the number."""
    seg = _latency(first_min_tokens=5)
    assert seg.push("Pi is 3.", 0.0) == []
    assert _texts(seg.push("14, roughly", 1.0)) == ["Pi is 3.14,"]


def test_latency_counts_cjk_characters():
    """Each CJK character is one token, and CJK punctuation marks a cut."""
    seg = _latency()
    assert seg.push("我们", 0.0) == []
    assert _texts(seg.push("去", 1.0)) == ["我们去"]
    seg = _latency(first_min_tokens=10)
    assert _texts(seg.push("好的，我们", 0.0)) == ["好的，"]


def test_latency_timeout_via_deadline_and_tick():
    """A slow first segment leaves at first text + first_max_wait_ms, cut after its complete words."""
    seg = _latency()
    seg.push("Hello", 100.0)
    assert seg.deadline_ms() is None  # "Hello" may still grow
    seg.push(" th", 150.0)
    assert seg.deadline_ms() == 400.0
    assert seg.tick(399.0) == []
    assert seg.tick(400.0) == [Segment(0, "Hello", False, SegmentOrigin.TICK)]
    assert seg.deadline_ms() is None
    assert seg.finish(500.0) == [Segment(1, " th", True, SegmentOrigin.FINISH)]


def test_latency_later_segments_sentence_and_cap():
    """Later segments end at a sentence mark after min_tokens, or at the max_tokens-th word."""
    seg = _latency(first_min_tokens=1, min_tokens=3, max_tokens=5)
    out = seg.push("Hi. One two. One two three. a b c d e f", 0.0)
    assert _texts(out) == ["Hi.", " One two. One two three.", " a b c d e"]
    assert _texts(seg.finish(1.0)) == [" f"]


def test_latency_finish_drops_whitespace_tail():
    """After the last cut, a whitespace-only remainder produces no final segment."""
    seg = _latency(first_min_tokens=1)
    assert _texts(seg.push("Done. ", 0.0)) == ["Done."]
    assert seg.finish(1.0) == []


def _is_latin_alnum(ch: str) -> bool:
    return ch.isalnum() and not "\u4e00" <= ch <= "\u9fff"  # a CJK character is a word by itself


def test_latency_streaming_preserves_text_and_word_boundaries():
    """For random delta splits, segments concatenate to the input and every cut falls between words."""
    text = "OK 好的，我们开始吧。Let us begin the test now, with 3.14 apples and 1,000 pears! Done?"
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), 12))
        deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        seg = _latency(first_min_tokens=2, min_tokens=3, max_tokens=6)
        segments = [s for i, d in enumerate(deltas) for s in seg.push(d, float(i))] + seg.finish(99.0)
        joined = "".join(_texts(segments))
        assert joined == text
        assert [s.segment_id for s in segments] == list(range(len(segments)))
        end = 0
        for s in segments[:-1]:
            end += len(s.text)
            assert _is_latin_alnum(text[end - 1]) + _is_latin_alnum(text[end]) < 2, (text[:end], deltas)
