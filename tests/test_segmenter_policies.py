"""Latency segmenter: the first-segment mark wait, abbreviations, and the policy benchmark on its corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import segmenter_policies as bench_seg
from realtime_ming.engine.segmenter import (
    Segment,
    Segmenter,
    SegmenterConfig,
    SegmentOrigin,
)
from realtime_ming.server.config import ConfigError, load_serve_config

REPO = Path(__file__).resolve().parents[1]


def _latency(**kwargs) -> Segmenter:
    return Segmenter(SegmenterConfig(policy="latency", **kwargs))


def _push_all(seg: Segmenter, pieces: list[str], step_ms: float = 1.0) -> list[Segment]:
    return [s for i, p in enumerate(pieces) for s in seg.push(p, i * step_ms) + seg.tick(i * step_ms)]


def test_mark_wait_holds_the_first_segment_for_a_clause_mark():
    """Inside the mark wait, three words are not enough: the first segment ends at the clause mark."""
    seg = _latency(first_mark_wait_ms=40.0)
    out = _push_all(seg, ["The", " capital", " of", " Australia", " is", " Canberra", ",", " not"], step_ms=3.0)
    assert [s.text for s in out] == ["The capital of Australia is Canberra,"]
    assert out[0].origin is SegmentOrigin.DELTA


def test_mark_wait_expiry_releases_the_complete_words_by_tick():
    """No mark by the end of the wait: a tick at deadline_ms releases every complete word, never a partial one."""
    seg = _latency(first_mark_wait_ms=30.0)
    assert seg.push("Running", 100.0) == [] and seg.deadline_ms() is None  # "Running" may still grow
    assert seg.push(" a", 105.0) == []
    assert seg.deadline_ms() == 400.0  # one complete word: only first_max_wait_ms (300) can force it
    assert seg.push(" marathon", 110.0) + seg.push(" with", 115.0) == []  # three words, but inside the wait
    assert seg.deadline_ms() == 130.0
    assert seg.push("out tr", 120.0) == []
    assert seg.tick(129.9) == []
    assert seg.tick(130.0) == [Segment(0, "Running a marathon without", False, SegmentOrigin.TICK)]
    assert seg.deadline_ms() is None
    assert [s.text for s in seg.finish(131.0)] == [" tr"]


def test_mark_wait_longer_than_max_wait_is_capped_by_it():
    """first_max_wait_ms still bounds the first segment when the mark wait is longer."""
    seg = _latency(first_mark_wait_ms=1000.0, first_max_wait_ms=200.0)
    _push_all(seg, ["one", " two", " three", " four", " "], step_ms=10.0)
    assert seg.deadline_ms() == 200.0
    assert [s.text for s in seg.tick(200.0)] == ["one two three four"]


def test_mark_wait_zero_keeps_the_plain_latency_rule():
    """The default (0) releases at first_min_tokens words at once, as before."""
    seg = _latency()
    assert SegmenterConfig(policy="latency").first_mark_wait_ms == 0.0
    assert [s.text for s in _push_all(seg, ["The", " capital", " of", " Australia"])] == ["The capital of"]


@pytest.mark.parametrize("kwargs", [{"first_mark_wait_ms": 10.0}, {"policy": "latency", "first_mark_wait_ms": -1.0}])
def test_mark_wait_is_validated(kwargs):
    """Negative waits and a mark wait on the reference policy (which has no such rule) are rejected."""
    with pytest.raises(ValueError, match="segmenter.first_mark_wait_ms"):
        SegmenterConfig(**kwargs)


def test_mark_wait_on_reference_is_a_config_error():
    """Set through a config override, the reference policy's missing rule is a clear ConfigError."""
    with pytest.raises(ConfigError, match="first_mark_wait_ms applies to policy 'latency' only"):
        load_serve_config(REPO / "configs" / "tiny-cpu.yaml", ["engine.segmenter.first_mark_wait_ms=30"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Dr. Patel can see you, or", "Dr. Patel can see you,"),
        ("Try iron, e.g. spinach", "Try iron,"),
        ("The U.S. dollar rose, i.e. up", "The U.S. dollar rose,"),
        ("Ask J. Smith today, please", "Ask J. Smith today,"),
        ("Mr. Lee from St. Louis called. He", "Mr. Lee from St. Louis called."),
        ("No. The store", "No."),  # a whole answer, not the abbreviation of "number"
    ],
)
def test_latency_does_not_cut_after_an_abbreviation(text, expected):
    """A '.' that ends a common abbreviation, a dotted run or an initial is not a sentence end."""
    seg = _latency(first_min_tokens=20)
    assert [s.text for s in seg.push(text, 0.0)] == [expected]


def test_reference_still_cuts_after_an_abbreviation():
    """The reference policy keeps sglang-omni's rule: any buffer ending in '.' with 8 tokens is a sentence."""
    seg = Segmenter()
    assert [s.text for s in seg.push("Please book me in with Dr. Patel or Mrs.", 0.0)] == [
        "Please book me in with Dr. Patel or Mrs."]


@pytest.mark.parametrize("pieces", ["bpe", "chars", "words"])
def test_bench_corpus_latency_variants_never_cut_mid_word(pieces):
    """Over the benchmark corpus, streamed in BPE-like pieces, characters ("10 a." | "m.") or words, at c=1 and
    c=32 step times, every latency variant keeps the text and cuts only between words, never after an
    abbreviation; the shipped variant's first segments end at a mark at least as often as plain latency."""
    corpus = json.loads(bench_seg.CORPUS.read_text(encoding="utf-8"))
    replies = corpus["replies"]
    assert len(replies) >= 40 and {r["lang"] for r in replies} == {"en", "zh"}
    shipped = load_serve_config(REPO / "configs" / "ming-flash-omni-2.0.yaml").engine.segmenter
    configs = {**bench_seg.variants([30.0]), "shipped": shipped}
    share = {}
    for step in (3.4, 30.0):
        for name, cfg in configs.items():
            rows = [bench_seg.run_reply(r, bench_seg.pieces_of(r["text"], pieces), cfg, step) for r in replies]
            summary = bench_seg.summarize(rows)
            share[name, step] = summary["first_at_mark_share"]
            if cfg.policy == "latency":
                assert summary["mid_word_cuts"] == 0 and summary["text_changed"] == 0, (name, step)
                assert "abbreviation" not in summary["first_cut"] and "abbreviation" not in summary["inner_cut_classes"]
    assert share["shipped", 3.4] > share["latency", 3.4]
    assert share["shipped", 30.0] >= share["latency", 30.0]


def test_latency_holds_a_single_letter_and_dot_at_the_buffer_end():
    """'a.' at the end of the stream so far may become 'a.m.': it is not a sentence end until the next piece."""
    seg = _latency(first_min_tokens=1, min_tokens=2)
    out = _push_all(seg, list("Hi. We leave at 7 a.m. sharp."))
    assert [s.text for s in out] == ["Hi.", " We leave at 7 a.m. sharp."]


def test_bench_classify_cut_names_each_place():
    """The benchmark's cut classes on hand-made cuts."""
    text = "Pi is 3.14, roughly. Dr. Smith don't 好的，我们"
    cases = {len("Pi is"): "after a word", len("Pi is 3."): "mid-word", len("Pi is 3.14,"): "clause",
             len("Pi is 3.14, roughly."): "sentence", len("Pi is 3.14, roughly. Dr."): "abbreviation",
             len("Pi is 3.14, roughly. Dr. Smith don"): "mid-word", len("Pi is 3.14, roughly. Dr. Smith don't 好"):
             "between CJK characters", len("Pi is 3.14, roughly. Dr. Smith don't 好的"): "before punctuation",
             len(text): "whole reply"}
    assert {pos: bench_seg.classify_cut(text, pos) for pos in cases} == cases


def test_bench_writes_json_markdown_and_exits_zero(tmp_path, capsys):
    """A small run of the command writes its three outputs and reports progress."""
    assert bench_seg.main(["--out", str(tmp_path), "--steps-ms", "3.4", "--mark-waits", "60"]) == 0
    result = json.loads((tmp_path / "segmenter_policies.json").read_text(encoding="utf-8"))
    assert set(result["steps"]["3.4"]) == {"reference", "latency", "latency+mark60ms"}
    assert "bpe" in result["tokens"]
    assert "| reference |" in (tmp_path / "segmenter_policies.md").read_text(encoding="utf-8")
    assert "[segmenter] step  3.4 ms  reference" in capsys.readouterr().out


def test_latency_timeout_does_not_cut_right_after_an_abbreviation():
    """When the first segment is overdue, 'Mr.' waits for its name; the deadline stays consistent with tick."""
    seg = _latency()
    assert seg.push("Mr. Thom", 0.0) == []
    assert seg.deadline_ms() is None  # nothing a tick could release: no busy wake-ups
    assert seg.tick(1000.0) == []
    assert [s.text for s in seg.push("pson called", 1001.0)] == ["Mr. Thompson"]
    seg = _latency()
    assert seg.push("Call Dr. Pat", 0.0) == []
    assert seg.deadline_ms() == 300.0
    assert seg.tick(300.0) == [Segment(0, "Call", False, SegmentOrigin.TICK)]
