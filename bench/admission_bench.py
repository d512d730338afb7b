"""Engine-thread time of admitting a turn (`ThinkerRunner.admit`) in a conversation with a 1024x768 image.

Turns: 1 the image arrives; 2-3 it is in the history (the slot holds it); 4 the conversation's slot was
dropped (the image is prefilled again, same array); 5 the same pixels in a fresh array (a history rebuilt
from the wire). Prints the median over `--repeat` conversations of each turn's admit time on the engine
thread (everything the runner does for the turn before its prefill is queued: prompt, media preprocessing,
encoders, embedding), and the whole turn's wall time.

    python3 bench/admission_bench.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

from realtime_ming.engine import Engine
from realtime_ming.engine.api import Content, Message, SamplingParams, TurnDone, TurnFailed, TurnRequest
from realtime_ming.engine.config import EngineConfig, ThinkerRunnerConfig


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    engine = Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(forced_reply="Fine.", max_slots=4)), warmup=False)
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
