"""Which engine code issues how many torch ops per engine step (CPU tiny model; the host side of issue 45).

    python -m bench.step_ops [--turns 24] [--streams 8] [--stagger 3] [--top 30]

Runs spoken turns through the embedded tiny engine (forced reply, fixed talker length), a new turn every `stagger`
engine steps, so talker streams start, end and move between rows all the time. Every aten op of every engine step
is counted under a dispatch mode on the engine thread, by the innermost `realtime_ming/engine/` frame that issued it.
Ops issued inside a step function that a GPU replays from a CUDA graph (`BucketedGraph.step`, the talker step, the
VAE chunk, the talker prefill) are counted apart as `graphed`: on a GPU they cost one graph launch, not one launch
each. Prints the eager ops per step by site and op; `--json` writes them.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter
from pathlib import Path

from torch.utils._python_dispatch import TorchDispatchMode

from realtime_ming.engine import Engine, graphs
from realtime_ming.engine.api import Content, Message, SamplingParams, TurnDone, TurnFailed, TurnRequest
from realtime_ming.engine.config import EngineConfig, TalkerRunnerConfig, ThinkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.models import ModelBundle

REPLY = "The sea is wide and deep, and the waves roll in, one after another, under a grey sky all day long. "
ENGINE_DIR = str(Path(__file__).resolve().parent.parent / "realtime_ming" / "engine")
MODEL_DIR = str(Path(ENGINE_DIR).parent / "model")
# step functions a GPU runs as one CUDA graph replay (eager on CPU), by qualified name
GRAPHED = {"BucketedGraph.step", "talker_step", "VAEStepper._eager", "Talker.prefill",
           "ThinkerDecoder._fn.<locals>.step"}
GRAPHED_CALLERS = {"ThinkerRunner._prefill"}  # the model's forward under these is graphed on a GPU
# metadata-only ops (no kernel, no copy) are not counted
SKIP = {"detach", "alias", "view", "_unsafe_view", "as_strided", "slice", "select", "unsqueeze", "squeeze", "expand",
        "permute", "transpose", "t", "reshape", "lift_fresh", "empty", "empty_like", "empty_strided", "split",
        "unbind", "narrow", "_reshape_alias", "_local_scalar_dense"}


def _site() -> tuple[str, bool]:
    """(innermost engine frame "file:line function", inside a graphed step function)."""
    frame, site, graphed, in_model = sys._getframe(2), None, False, False
    while frame is not None:
        code = frame.f_code
        in_model = in_model or (site is None and code.co_filename.startswith(MODEL_DIR))
        graphed = graphed or code.co_qualname in GRAPHED
        if site is None and code.co_filename.startswith(ENGINE_DIR):
            site = f"{code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} {code.co_name}"
            graphed = graphed or (in_model and code.co_qualname in GRAPHED_CALLERS)
        frame = frame.f_back
    return site or "?", graphed


_UPLOAD = graphs.upload


class OpCounter(TorchDispatchMode):
    """Counts aten ops by (site, op), eager and graphed apart."""

    def __init__(self):
        super().__init__()
        self.eager: Counter = Counter()
        self.graphed: Counter = Counter()

    def upload(self, values, dtype, device):
        """`graphs.upload`, counted: on a GPU one pinned staging tensor and one host-to-device copy each."""
        self.eager[(_site()[0], "upload")] += 1
        return _UPLOAD(values, dtype, device)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = func.overloadpacket.__name__
        if op not in SKIP:
            site, graphed = _site()
            (self.graphed if graphed else self.eager)[(site, op)] += 1
        return func(*args, **(kwargs or {}))


def run(turns: int, streams: int, stagger: int) -> tuple[int, OpCounter]:
    """Run `turns` spoken turns, a new one every `stagger` engine steps -> (engine steps, counts)."""
    cfg = EngineConfig(thinker=ThinkerRunnerConfig(max_slots=streams, max_batch=streams, max_seq_len=512),
                       talker=TalkerRunnerConfig(max_streams=streams))
    engine = Engine(cfg, ModelBundle.load(cfg).with_hooks(EngineHooks(forced_reply=REPLY, steps_per_word=1)))
    counter, steps, done, stepped = OpCounter(), [0], threading.Semaphore(0), threading.Condition()
    inner = engine._step

    def counted() -> None:
        with counter:
            inner()
        with stepped:
            steps[0] += 1
            stepped.notify_all()

    engine._step = counted
    for name, module in list(sys.modules.items()):
        if name.startswith("realtime_ming.engine.") and getattr(module, "upload", None) is _UPLOAD:
            module.upload = counter.upload

    def sink(event) -> None:
        if isinstance(event, (TurnDone, TurnFailed)):
            done.release()

    try:
        for i in range(turns):
            msg = Message("user", (Content.of_text("Tell me about the sea."),))
            engine.submit(TurnRequest(f"t{i}", f"c{i}", (msg,), with_audio=True,
                                      sampling=SamplingParams(max_tokens=24, ignore_eos=True, seed=i)), sink)
            with stepped:
                target = steps[0] + stagger
                stepped.wait_for(lambda: steps[0] >= target, timeout=60)
        for _ in range(turns):
            if not done.acquire(timeout=300):
                raise RuntimeError("a turn did not finish")
    finally:
        engine.close()
    return steps[0], counter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=24)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--stagger", type=int, default=3)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    steps, counter = run(args.turns, args.streams, args.stagger)
    eager, graphed = sum(counter.eager.values()), sum(counter.graphed.values())
    print(f"{steps} engine steps: eager ops {eager / steps:.1f} a step, graphed {graphed / steps:.1f}")
    by_site = Counter()
    for (site, _), k in counter.eager.items():
        by_site[site] += k
    print("\neager ops per step by site")
    for site, k in by_site.most_common(args.top):
        ops = Counter({op: v for (s, op), v in counter.eager.items() if s == site})
        detail = ", ".join(f"{op} {v / steps:.2f}" for op, v in ops.most_common(4))
        print(f"{k / steps:8.2f}  {site}  ({detail})")
    if args.json:
        flat = {kind: {f"{s} {o}": k for (s, o), k in getattr(counter, kind).items()} for kind in ("eager", "graphed")}
        args.json.write_text(json.dumps({"steps": steps, **flat}, indent=1))


if __name__ == "__main__":
    main()
