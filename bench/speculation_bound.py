"""Speculation bound benchmark: what a speculative turn confirmed after a long turn decision costs and releases.

    python -m bench.speculation_bound [--delay-s 2.0] [--rounds 3] [--max-tokens 400] [--steps-per-word 2] [--out DIR]

The tiny CPU engine (`engine_bench`'s config: a scripted reply of real words, so the segmenter and the talker see
words, `--steps-per-word` talker steps a word) runs a spoken speculative turn (`ignore_eos`), its confirm delayed by
`--delay-s` (semantic_vad's silence fallback of eagerness high is 2 s), once as before the bound
(`speculation_lookahead_ms` and `_tokens` null, and the held events released as they were held, uncoalesced) and
once with the engine's defaults. Per mode, medians over the
rounds of: events held at the confirm (`EngineStats.held_events`), thinker decode rows and talker stream-steps
spent before it (the runners' `_decode` / `_advance` calls, counted by row), the events the confirm delivered at
once and the wire frames they make (a text delta is one frame; an audio chunk one frame per `output_frame_ms`
unless released as one backlog delta), and the ms from the confirm to the first audio at the sink.
Writes speculation_bound.json and .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.engine_bench import bench_engine_config, bench_hooks
from realtime_ming.engine import Engine, speculation
from realtime_ming.engine.api import (
    AudioChunk,
    Content,
    Message,
    SamplingParams,
    Stage,
    StageMark,
    TextDelta,
    TurnRequest,
)
from realtime_ming.engine.models import ModelBundle
from realtime_ming.session.config import SessionSettings

WIRE_HZ = 24000
MODES = {"before (unbounded, uncoalesced)": {"speculation_lookahead_ms": None, "speculation_lookahead_tokens": None},
         "after (defaults)": {}}


class _Counter:
    """Counts the rows a runner method is called with (the method's first argument), wrapping it on the instance."""

    def __init__(self, obj, name: str) -> None:
        self.n = 0
        inner = getattr(obj, name)

        def counted(rows, *args, **kw):
            self.n += len(rows)
            return inner(rows, *args, **kw)

        setattr(obj, name, counted)


def _frames(events: list, frame_ms: int) -> int:
    n = 0
    for e in events:
        if isinstance(e, TextDelta):
            n += 1
        elif isinstance(e, AudioChunk):
            n += 1 if e.backlog else math.ceil(e.pcm.size / e.sample_rate_hz * 1000 / frame_ms)
    return n


def _round(engine: Engine, turn_id: str, delay_s: float, max_tokens: int, frame_ms: int) -> dict:
    thinker, talker = _Counter(engine._thinker, "_decode"), _Counter(engine._talker.runner, "_advance")
    events, audio_at, confirmed_at = [], [], []
    lock = threading.Lock()

    def sink(event) -> None:
        with lock:
            events.append(event)
            if isinstance(event, AudioChunk) and confirmed_at and not audio_at:
                audio_at.append(time.perf_counter())

    sampling = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=max_tokens, seed=1, ignore_eos=True)
    request = TurnRequest(turn_id, turn_id, (Message("user", (Content.of_text("Tell me a long story."),)),),
                          sampling=sampling, speculative=True)
    engine.submit(request, sink)
    time.sleep(delay_s)
    held = engine.stats().held_events  # answered at a step boundary
    spent = (thinker.n, talker.n)
    with lock:
        confirmed_at.append(time.perf_counter())
    engine.confirm(turn_id)
    while not any(isinstance(e, StageMark) and e.stage is Stage.CONFIRMED for e in list(events)):
        time.sleep(0.001)
    engine.cancel(turn_id)
    cut = next(i for i, e in enumerate(events) if isinstance(e, StageMark) and e.stage is Stage.CONFIRMED)
    released = events[:cut]
    return {"held_events": held, "thinker_rows": spent[0], "talker_stream_steps": spent[1],
            "released_events": len(released), "released_wire_frames": _frames(released, frame_ms),
            "released_audio_s": sum(e.pcm.size / e.sample_rate_hz for e in released if isinstance(e, AudioChunk)),
            "confirm_to_first_audio_ms": (audio_at[0] - confirmed_at[0]) * 1000.0 if audio_at else None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay-s", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--steps-per-word", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    frame_ms = SessionSettings().output_frame_ms
    base = bench_engine_config(None, [], [1])
    base = dataclasses.replace(base, thinker=dataclasses.replace(base.thinker, max_seq_len=max(1024, args.max_tokens + 64)))
    bundle = ModelBundle.load(base, hooks=bench_hooks(args.steps_per_word))
    coalesce, results = speculation.coalesce, {}
    for mode, overrides in MODES.items():
        engine = Engine(dataclasses.replace(base, **overrides), bundle)
        speculation.coalesce = coalesce if not overrides else list  # before: the held list as it was held
        try:
            rounds = [_round(engine, f"r{i}", args.delay_s, args.max_tokens, frame_ms) for i in range(args.rounds)]
        finally:
            speculation.coalesce = coalesce
            engine.close()
        results[mode] = {k: statistics.median(r[k] for r in rounds) if rounds[0][k] is not None else None
                         for k in rounds[0]}
        print(mode, json.dumps(results[mode]), flush=True)
    rows = [("| mode | held events | thinker rows | talker stream-steps | released events | wire frames | "
             "held audio s | confirm → first audio ms |"), "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode, r in results.items():
        ttfa = "–" if r["confirm_to_first_audio_ms"] is None else f"{r['confirm_to_first_audio_ms']:.1f}"
        rows.append(f"| {mode} | {r['held_events']:.0f} | {r['thinker_rows']:.0f} | {r['talker_stream_steps']:.0f} | "
                    f"{r['released_events']:.0f} | {r['released_wire_frames']:.0f} | {r['released_audio_s']:.2f} | "
                    f"{ttfa} |")
    print("\n".join(rows))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "speculation_bound.json").write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                                                      "results": results}, indent=2) + "\n")
        (args.out / "speculation_bound.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
