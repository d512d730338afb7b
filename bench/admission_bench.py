"""Engine-thread time of admitting a turn (`ThinkerRunner.admit`) in a conversation with a 1024x768 image.

Turns: 1 the image arrives; 2-3 it is in the history (the slot holds it); 4 the conversation's slot was
dropped (the image is prefilled again, same array); 5 the same pixels in a fresh array (a history rebuilt
from the wire). Prints the median over `--repeat` conversations of each turn's admit time on the engine
thread (everything the runner does for the turn before its prefill is queued: prompt, media preprocessing,
encoders, embedding), and the whole turn's wall time.

    python3 bench/admission_bench.py [--repeat 3]

`--burst N`: instead, 4 text turns decode while N spoken-in turns (2 s of audio each) arrive at once; prints
the largest gap between the running turns' text deltas while the burst is admitted (how long their decode
stalled behind the burst's admissions: audio encoder, embedding splice) and the burst turns' median time to
first token, medians over `--repeat` bursts.

    python3 bench/admission_bench.py --burst 8 [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

from realtime_ming.engine import Engine
from realtime_ming.engine.api import (Content, Message, SamplingParams, TextDelta, TurnCancelled, TurnDone, TurnFailed,
                                      TurnRequest)
from realtime_ming.engine.config import EngineConfig, ThinkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks


def _turn(engine: Engine, turn_id: str, conversation: str, history: list) -> TurnDone:
    done, box = threading.Event(), []

    def sink(ev):
        if isinstance(ev, (TurnDone, TurnFailed)):
            box.append(ev)
            done.set()

    engine.submit(TurnRequest(turn_id, conversation, tuple(history), sampling=SamplingParams(max_tokens=2),
                              with_audio=False), sink)
    done.wait(300)
    if not isinstance(box[0], TurnDone):
        raise RuntimeError(box[0])
    return box[0]


def _burst(n: int, repeat: int) -> None:
    engine = Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(max_slots=n + 4)), warmup=False,
                           hooks=EngineHooks(forced_reply="Fine."))
    audio = (0.1 * np.random.default_rng(0).standard_normal(32000)).astype(np.float32)
    gaps, firsts = [], []
    try:
        for r in range(repeat + 1):  # the first burst warms up
            times: dict[str, list[float]] = {}
            done: dict[str, threading.Event] = {}

            def start(turn_id, content, max_tokens):
                times[turn_id], done[turn_id] = [time.perf_counter()], threading.Event()

                def sink(ev, turn_id=turn_id):
                    if isinstance(ev, TextDelta):
                        times[turn_id].append(time.perf_counter())
                    elif isinstance(ev, (TurnDone, TurnFailed, TurnCancelled)):
                        done[turn_id].set()

                engine.submit(TurnRequest(turn_id, turn_id, (Message("user", content),), with_audio=False,
                                          sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True)), sink)

            running = [f"r{r}-run{k}" for k in range(4)]
            for turn_id in running:
                start(turn_id, (Content.of_text("Tell me about the sea."),), 64)
            while any(len(times[t]) < 3 for t in running):
                time.sleep(0.005)
            t0 = time.perf_counter()
            burst = [f"r{r}-burst{k}" for k in range(n)]
            for turn_id in burst:
                start(turn_id, (Content.of_audio(audio, 16000), Content.of_text("What did I say?")), 2)
            for turn_id in burst:
                done[turn_id].wait(300)
            t1 = time.perf_counter()
            for turn_id in running:
                engine.cancel(turn_id)
            for turn_id in running:
                done[turn_id].wait(300)
            if r == 0:
                continue
            gaps.append(max(b - a for t in running for a, b in zip(times[t], times[t][1:]) if b > t0 and a < t1))
            firsts.append(statistics.median(times[t][1] - times[t][0] for t in burst if len(times[t]) > 1))
    finally:
        engine.close()
    print(f"burst of {n} spoken-in turns beside 4 decoding turns, median of {repeat}: largest decode gap of the "
          f"running turns {statistics.median(gaps) * 1e3:.1f} ms, burst turns' time to first token "
          f"{statistics.median(firsts) * 1e3:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--burst", type=int, default=0, help="N spoken-in turns at once beside 4 decoding turns")
    args = ap.parse_args()
    if args.burst:
        _burst(args.burst, args.repeat)
        return
    engine = Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(max_slots=4)), warmup=False,
                           hooks=EngineHooks(forced_reply="Fine."))
    runner = engine._thinker
    admit_ms: list[float] = []
    real = runner.admit

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            admit_ms.append((time.perf_counter() - t) * 1e3)

    runner.admit = timed
    labels = ["1 new image", "2 image in history", "3 image in history", "4 slot dropped", "5 fresh array"]
    table: dict[str, list[tuple[float, float]]] = {k: [] for k in labels}
    try:
        for r in range(args.repeat):
            image = np.random.default_rng(r).integers(0, 256, (768, 1024, 3), dtype=np.uint8)
            conv = f"conv{r}"
            history = [Message("user", (Content.of_image(image), Content.of_text("What is this?")))]
            for k, label in enumerate(labels):
                if label == "4 slot dropped":
                    engine.close_conversation(conv)
                if label == "5 fresh array":
                    history[0] = Message("user", (Content.of_image(image.copy()), Content.of_text("What is this?")))
                    engine.close_conversation(conv)
                t = time.perf_counter()
                done = _turn(engine, f"{conv}-{k}", conv, history)
                table[label].append((admit_ms[-1], (time.perf_counter() - t) * 1e3))
                history += [Message("assistant", (Content.of_text(done.text),)),
                            Message("user", (Content.of_text(f"And {k}?"),))]
    finally:
        engine.close()
    print(f"{'turn':<22} {'engine-thread admit ms':>24} {'turn wall ms':>14}")
    for label, rows in table.items():
        print(f"{label:<22} {statistics.median(a for a, _ in rows):>24.1f} {statistics.median(w for _, w in rows):>14.1f}")


if __name__ == "__main__":
    main()
