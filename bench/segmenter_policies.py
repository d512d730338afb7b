"""Segmenter policies on CPU: how long the first segment waits, and how faithful its cut is.

Every reply of `bench/segmenter_replies.json` is fed token by token through the real
`realtime_ming.engine.segmenter.Segmenter` on a virtual clock: one token per decode step at 3.4 ms
(one stream, c=1) and 30 ms (a batch of 32) by default, a tick after every step (the engine ticks once
per loop iteration), finish() one step after the last token. Per policy variant and step interval it
reports: time from first text to first segment, the first segment's length, where the first cut falls
(sentence end / clause mark / after a word / between CJK characters / after an abbreviation / before
punctuation / mid-word / the whole reply) and what released it (a delta, the timeout tick, the end of
stream), segments per reply, and the share of cuts inside a reply that sit at a sentence or clause mark.
A `latency` variant that ever cuts mid-word fails the run (exit 1).

Tokens: `--tokenizer PATH` (a tokenizer.json, streamed with UTF-8-safe incremental decoding); without
it the first tokenizer.json under tests/fixtures/, else BPE-like pieces (`--pieces`, default `bpe`: the
Qwen2 pre-tokenizer split — words with their leading space, each digit, punctuation runs — with words
over 10 letters cut into 6-letter pieces and one piece per CJK character). The report names which.

    python3 -m bench.segmenter_policies --out bench/out/segmenter
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from tokenizers import Regex, pre_tokenizers

from realtime_ming.engine.segmenter import (
    Segment,
    Segmenter,
    SegmenterConfig,
)

__all__ = ["classify_cut", "main", "pieces_of", "simulate"]

_HERE = Path(__file__).resolve().parent
CORPUS = _HERE / "segmenter_replies.json"
# Qwen2's pre-tokenizer (contractions, letters with one leading non-letter, single digits, punctuation runs).
_PRETOKENIZE = pre_tokenizers.Split(Regex(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
), behavior="isolated")
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")
_SENTENCE = set(".!?;…。！？；")
_CLAUSE = set(",:、，：")
_CLOSERS = "\"'”’»)]}）】」』》〉"
_ABBREVIATIONS = {"dr", "mr", "mrs", "ms", "prof", "sr", "jr", "st", "vs", "etc", "approx", "fig", "inc", "ltd"}
MARK_CLASSES = ("sentence", "clause", "whole reply")  # a first segment that is a complete clause or more


def pieces_of(text: str, mode: str) -> list[str]:
    """Split `text` into decode-step pieces without a tokenizer ("bpe", "words" or "chars")."""
    if mode == "chars":
        return list(text)
    if mode == "words":
        return re.findall(r"\s*\S+", text) + ([text[len(text.rstrip()):]] if text != text.rstrip() else [])
    out: list[str] = []
    for piece, _ in _PRETOKENIZE.pre_tokenize_str(text):
        if _CJK.search(piece):
            out.extend(re.findall(r"\s?\S", piece))  # one piece per character (CJK punctuation too)
        elif sum(c.isalpha() for c in piece) > 10:
            out.extend(piece[i:i + 6] for i in range(0, len(piece), 6))
        else:
            out.append(piece)
    return out


def tokenizer_deltas(tokenizer, text: str) -> list[str]:
    """Deltas of a real tokenizer, one per token; a token that ends inside a UTF-8 character gives ''."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    deltas, shown = [], ""
    for i in range(len(ids)):
        decoded = tokenizer.decode(ids[: i + 1])
        if decoded.endswith("\ufffd"):
            deltas.append("")
            continue
        deltas.append(decoded[len(shown):])
        shown = decoded
    return deltas


def simulate(deltas: list[str], cfg: SegmenterConfig, step_ms: float) -> tuple[list[tuple[float, Segment]], float]:
    """Feed one delta per step (first at t=0), tick after each step, finish one step after the last.
    Returns the released segments with their times and the first text's time."""
    seg = Segmenter(cfg)
    released: list[tuple[float, Segment]] = []
    first_text_ms = None
    for i, delta in enumerate(deltas):
        now = i * step_ms
        if delta and first_text_ms is None:
            first_text_ms = now
        released += [(now, s) for s in seg.push(delta, now) + seg.tick(now)]
    end = len(deltas) * step_ms
    released += [(end, s) for s in seg.finish(end)]
    return released, (first_text_ms or 0.0)


def _core_mark(left: str) -> str:
    run = re.split(r"\s", left)[-1] if not left[-1].isspace() else ""
    core = left.rstrip(_CLOSERS)
    last = core[-1:]
    stem = run.rstrip(_CLOSERS)[:-1].lstrip("\"'“‘«([{")
    if last == "." and stem.replace(".", "").isalpha() and (
            "." in stem or stem.lower() in _ABBREVIATIONS or (len(stem) == 1 and stem.isupper())):
        return "abbreviation"
    if last in _SENTENCE:
        return "sentence"
    if last in _CLAUSE:
        return "clause"
    return ""


def classify_cut(text: str, pos: int) -> str:
    """Where a cut at character `pos` of the reply `text` falls (the segment is text[:pos])."""
    if not text[pos:].strip():
        return "whole reply"
    a, b = text[pos - 1], text[pos]
    if not a.isspace() and not b.isspace() and not _CJK.match(b):
        if b.isalnum() and not _CJK.match(a):
            return "mid-word"  # includes a number cut at its separator ("3." | "14")
        if b in "'’" and text[pos + 1:pos + 2].isalnum() and a.isalnum():
            return "mid-word"  # "don" | "'t"
        if not b.isalnum():
            return "before punctuation"  # "world" | ",", "今天" | "，", 'knowledge.' | '"'
    mark = _core_mark(text[:pos].rstrip())
    if mark:
        return mark
    return "between CJK characters" if _CJK.match(a) and _CJK.match(b) else "after a word"


def _first_length(text: str, lang: str) -> int:
    """Words (whitespace) for English, characters without punctuation for CJK text."""
    if lang == "zh":
        return len(_CJK.findall(text))
    return len(text.split())


def run_reply(reply: dict, deltas: list[str], cfg: SegmenterConfig, step_ms: float) -> dict:
    text = reply["text"]
    released, first_text_ms = simulate(deltas, cfg, step_ms)
    segments = [s for _, s in released]
    preserved = "".join(s.text for s in segments) == text
    cuts, pos = [], 0
    for s in segments:
        pos += len(s.text)
        if preserved and pos < len(text.rstrip()):
            cuts.append(classify_cut(text, pos))
    t0, first = released[0]
    first_class = classify_cut(text, len(first.text)) if preserved else "text changed"
    return {
        "id": reply["id"], "lang": reply["lang"], "kind": reply["kind"],
        "first_delay_ms": round(t0 - first_text_ms, 3), "first_text": first.text,
        "first_length": _first_length(first.text, reply["lang"]), "first_chars": len(first.text.strip()),
        "first_cut": first_class, "first_origin": first.origin.value,
        "segments": len(segments), "inner_cuts": cuts, "text_preserved": preserved,
    }


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def _share_at_mark(cuts: list[str]) -> float:
    return sum(c in ("sentence", "clause") for c in cuts) / len(cuts) if cuts else 1.0


def summarize(rows: list[dict]) -> dict:
    delays = [r["first_delay_ms"] for r in rows]
    inner = [c for r in rows for c in r["inner_cuts"]]
    by_lang = {}
    for lang in sorted({r["lang"] for r in rows}):
        sub = [r for r in rows if r["lang"] == lang]
        by_lang[lang] = {"n": len(sub), "first_delay_p50_ms": statistics.median(r["first_delay_ms"] for r in sub),
                         "first_length_p50": statistics.median(r["first_length"] for r in sub)}
    return {
        "n": len(rows),
        "first_delay_p50_ms": statistics.median(delays), "first_delay_p90_ms": _pct(delays, 0.9),
        "first_delay_max_ms": max(delays),
        "first_chars_p50": statistics.median(r["first_chars"] for r in rows),
        "first_cut": dict(Counter(r["first_cut"] for r in rows).most_common()),
        "first_origin": dict(Counter(r["first_origin"] for r in rows).most_common()),
        "first_at_mark_share": sum(r["first_cut"] in MARK_CLASSES for r in rows) / len(rows),
        "segments_per_reply": statistics.mean(r["segments"] for r in rows),
        "inner_cuts": len(inner), "inner_cuts_at_mark_share": _share_at_mark(inner),
        "inner_cut_classes": dict(Counter(inner).most_common()),
        "later_cuts_at_mark_share": _share_at_mark([c for r in rows for c in r["inner_cuts"][1:]]),
        "mid_word_cuts": inner.count("mid-word"),  # inner cuts include the first one
        "text_changed": sum(not r["text_preserved"] for r in rows),
        "by_lang": by_lang,
    }


def variants(mark_waits: list[float]) -> dict[str, SegmenterConfig]:
    out = {"reference": SegmenterConfig(policy="reference"), "latency": SegmenterConfig(policy="latency")}
    for wait in mark_waits:
        out[f"latency+mark{wait:g}ms"] = SegmenterConfig(policy="latency", first_mark_wait_ms=wait)
    return out


def _find_tokenizer(path: str | None):
    """(tokenizer, description) from --tokenizer or tests/fixtures; (None, None) when there is none."""
    candidates = [Path(path)] if path else sorted((_HERE.parent / "tests" / "fixtures").rglob("tokenizer.json"))
    if path and not candidates[0].is_file():
        raise SystemExit(f"--tokenizer {path}: no such file")
    if not candidates:
        return None, None
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(candidates[0])), f"tokenizer.json ({candidates[0]})"


def _markdown(result: dict) -> str:
    lines = [(f"Tokens: {result['tokens']}. Corpus: {result['corpus']['replies']} replies "
              f"({result['corpus']['by_lang']}), `{result['corpus']['file']}`."), ""]
    for step, table in result["steps"].items():
        lines += [f"### {step} ms per decode step", "",
                  ("| variant | first seg. p50 / p90 / max (ms) | en p50 (ms) | zh p50 (ms) | first seg. words (en) / chars (zh) p50 "
                   "| first cut at sentence/clause/whole | first cuts (class: n) | released by | segments / reply "
                   "| cuts inside the reply at a mark (all / after the first) | mid-word |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, s in table.items():
            lang = s["by_lang"]
            cuts = ", ".join(f"{k}: {v}" for k, v in s["first_cut"].items())
            origins = ", ".join(f"{k}: {v}" for k, v in s["first_origin"].items())
            lines.append(
                f"| {name} | {s['first_delay_p50_ms']:.1f} / {s['first_delay_p90_ms']:.1f} / {s['first_delay_max_ms']:.1f} "
                f"| {lang.get('en', {}).get('first_delay_p50_ms', 0):.1f} | {lang.get('zh', {}).get('first_delay_p50_ms', 0):.1f} "
                f"| {lang.get('en', {}).get('first_length_p50', 0):g} / {lang.get('zh', {}).get('first_length_p50', 0):g} "
                f"| {100 * s['first_at_mark_share']:.0f}% | {cuts} | {origins} | {s['segments_per_reply']:.2f} "
                f"| {100 * s['inner_cuts_at_mark_share']:.0f}% of {s['inner_cuts']} / {100 * s['later_cuts_at_mark_share']:.0f}% "
                f"| {s['mid_word_cuts']} |")
        lines.append("")
    cal = result["calibration"]
    lines += ["### Calibration: the GPU e2e forced reply", "",
              f"`{cal['text'].strip()}` — first-segment delay at {cal['step_ms']} ms per step: "
              + ", ".join(f"{k} {v['first_delay_ms']:.1f} ms (`{v['first_text'].strip()}`)" for k, v in cal["variants"].items()),
              ""]
    return "\n".join(lines)


def _plot(result: dict, out: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    steps = list(result["steps"])
    fig, axes = plt.subplots(1, len(steps), figsize=(6 * len(steps), 4.5), squeeze=False)
    for ax, step in zip(axes[0], steps):
        for name, s in result["steps"][step].items():
            x, y = s["first_delay_p50_ms"], 100 * s["first_at_mark_share"]
            ax.scatter([x], [y], color="tab:red" if name == "reference" else "tab:blue")
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel("first text → first segment, p50 (ms)")
        ax.set_ylabel("first segment is a clause, sentence or whole reply (%)")
        ax.set_title(f"{step} ms per decode step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "segmenter_policies.png", dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for segmenter_policies.json / .md / .png")
    parser.add_argument("--steps-ms", default="3.4,10,30",
                        help="decode step intervals, ms (default: c=1, about c=8-16, c=32)")
    parser.add_argument("--mark-waits", default="20,30,45,60,90,150", help="first_mark_wait_ms values of the latency variants")
    parser.add_argument("--tokenizer", help="a tokenizer.json to stream the replies through")
    parser.add_argument("--pieces", choices=("bpe", "words", "chars"), default="bpe", help="pieces when no tokenizer")
    parser.add_argument("--corpus", default=str(CORPUS))
    parser.add_argument("--calibration-step-ms", type=float, default=3.4)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = json.loads(Path(args.corpus).read_text(encoding="utf-8"))
    tokenizer, described = _find_tokenizer(args.tokenizer)
    if tokenizer is None:
        described = f"no tokenizer.json in tests/fixtures; `{args.pieces}` pieces (see the module docstring)"
        split = lambda text: pieces_of(text, args.pieces)
    else:
        split = lambda text: tokenizer_deltas(tokenizer, text)
    print(f"[segmenter] tokens: {described}", flush=True)
    replies = corpus["replies"]
    deltas = {r["id"]: split(r["text"]) for r in replies}
    print(f"[segmenter] {len(replies)} replies, {sum(map(len, deltas.values()))} tokens", flush=True)
    configs = variants([float(w) for w in args.mark_waits.split(",") if w])
    result = {"tokens": described, "corpus": {"file": Path(args.corpus).name, "replies": len(replies),
                                             "by_lang": dict(Counter(r["lang"] for r in replies))},
              "configs": {k: {f: getattr(v, f) for f in v.__dataclass_fields__} for k, v in configs.items()},
              "steps": {}, "rows": {}}
    started = time.perf_counter()
    failed = []
    for step in (float(s) for s in args.steps_ms.split(",")):
        key = f"{step:g}"
        result["steps"][key], result["rows"][key] = {}, {}
        for name, cfg in configs.items():
            rows = [run_reply(r, deltas[r["id"]], cfg, step) for r in replies]
            summary = summarize(rows)
            result["steps"][key][name], result["rows"][key][name] = summary, rows
            print(f"[segmenter] step {key:>4} ms  {name:<20} first p50 {summary['first_delay_p50_ms']:6.1f} ms "
                  f"p90 {summary['first_delay_p90_ms']:6.1f}  at mark {100 * summary['first_at_mark_share']:3.0f}%  "
                  f"mid-word {summary['mid_word_cuts']}", flush=True)
            if cfg.policy == "latency" and summary["mid_word_cuts"]:
                failed.append(f"{name} @ {key} ms")
    cal = corpus["calibration"]
    cal_deltas = split(cal["text"])
    result["calibration"] = {"text": cal["text"], "step_ms": args.calibration_step_ms, "tokens": len(cal_deltas),
                             "variants": {name: run_reply(cal, cal_deltas, cfg, args.calibration_step_ms)
                                          for name, cfg in configs.items()}}
    (out / "segmenter_policies.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "segmenter_policies.md").write_text(_markdown(result) + "\n", encoding="utf-8")
    plotted = _plot(result, out)
    print(f"[segmenter] wrote {out}/segmenter_policies.json, .md{', .png' if plotted else ' (no matplotlib: no plot)'}"
          f" in {time.perf_counter() - started:.1f} s", flush=True)
    if failed:
        print(f"[segmenter] FAIL: latency cut mid-word in {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
