"""Talker admission benchmark: how long a text segment waits for its first talker step, in engine steps and ms,
and the engine thread's host time per talker job started (`TalkerRunner._start`: prompt build + tokenisation,
prefill, voice head, history, VAE reset) — the tiny model on the CPU, or any engine config on a GPU (--config).

    python -m bench.talker_admission [--levels 1,8] [--rounds 2] [--waves 2] [--max-tokens 24]
                                     [--steps-per-word 2] [--config FILE --set a.b=c ...] [--out DIR]

Every turn is spoken, with a scripted reply (`engine_bench`'s `forced_reply`) so the segmenter and the talker see
real words. Per level: medians over every turn of the gaps between the stage marks FIRST_SEGMENT (the turn's first
segment reaches the talker's queue), FIRST_TALKER_STEP (its first talker step was collected) and FIRST_PCM, in ms
and in engine steps (`Engine._step` calls between the two marks), the engine step's median wall time, and the host
ms per `_start` call and per `_admit` call that started at least one job. Writes talker_admission.json and .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch

from bench.engine_bench import StepClock, _commit, _cpu_model, bench_engine_config, bench_hooks, run_level, write_results
from realtime_ming.engine import Engine
from realtime_ming.engine.api import Stage

__all__ = ["AdmissionProbe", "main"]

_GAPS = ((Stage.FIRST_SEGMENT, Stage.FIRST_TALKER_STEP), (Stage.FIRST_TALKER_STEP, Stage.FIRST_PCM),
         (Stage.FIRST_SEGMENT, Stage.FIRST_PCM))


class AdmissionProbe:
    """Wraps the engine's step, stage marks and talker admission (profiling only; engine thread)."""

    def __init__(self, engine: Engine):
        self.steps = 0
        self.step_s: list[float] = []
        self.marks: dict[str, dict[Stage, tuple[float, int]]] = defaultdict(dict)  # turn -> stage -> (t, step)
        self.start_s: list[float] = []  # per talker job started
        self.admit_s: list[float] = []  # per `_admit` call that started a job
        table = engine._table
        step, mark = engine._step, table.mark

        def timed_step():
            self.steps += 1
            t0 = time.perf_counter()
            try:
                return step()
            finally:
                self.step_s.append(time.perf_counter() - t0)

        def recorded_mark(turn, stage):
            mark(turn, stage)
            self.marks[turn.request.turn_id].setdefault(stage, (turn.stages[stage], self.steps))

        engine._step, table.mark = timed_step, recorded_mark
        for member in getattr(engine._talker, "members", [engine._talker]):  # a talker pool: every replica's driver
            self._wrap_admission(member.runner)  # an inline driver's (a talker process's runner is not here)

    def _wrap_admission(self, talker) -> None:
        start, admit = talker._start, talker._admit

        def timed_start(job, queue):
            t0 = time.perf_counter()
            try:
                return start(job, queue)
            finally:
                self.start_s.append(time.perf_counter() - t0)

        def timed_admit():
            t0, n = time.perf_counter(), len(self.start_s)
            try:
                return admit()
            finally:
                if len(self.start_s) > n:
                    self.admit_s.append(time.perf_counter() - t0)

        talker._start, talker._admit = timed_start, timed_admit

    def reset(self) -> None:
        self.marks.clear()
        self.step_s.clear()
        self.start_s.clear()
        self.admit_s.clear()

    def sample(self) -> dict:
        gaps = {}
        for a, b in _GAPS:
            pairs = [(m[b][0] - m[a][0], m[b][1] - m[a][1]) for m in self.marks.values() if a in m and b in m]
            gaps[f"{a.value}->{b.value}"] = {"ms": [1000 * p[0] for p in pairs], "steps": [p[1] for p in pairs]}
        return {"gaps": gaps, "step_ms": [1000 * s for s in self.step_s], "start_ms": [1000 * s for s in self.start_s],
                "admit_ms": [1000 * s for s in self.admit_s]}


def _q(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarise(samples: list[dict]) -> dict:
    out = {}
    for n in sorted({s["n"] for s in samples}):
        rows = [s for s in samples if s["n"] == n]
        pool = lambda *keys: [v for r in rows for v in _dig(r, keys)]  # noqa: E731
        out[n] = {
            "turns": sum(len(r["gaps"][f"{Stage.FIRST_SEGMENT.value}->{Stage.FIRST_TALKER_STEP.value}"]["ms"])
                         for r in rows),
            "gaps": {g: {"ms_p50": statistics.median(pool("gaps", g, "ms")),
                         "steps_p50": statistics.median(pool("gaps", g, "steps")),
                         "steps_max": max(pool("gaps", g, "steps"))} for g in rows[0]["gaps"] if pool("gaps", g, "ms")},
            "step_ms_p50": statistics.median(pool("step_ms")),
            "start_ms_p50": statistics.median(pool("start_ms")), "start_ms_p90": _q(pool("start_ms"), 0.9),
            "starts": len(pool("start_ms")),
            "admit_ms_p50": statistics.median(pool("admit_ms")), "admit_ms_p90": _q(pool("admit_ms"), 0.9),
            "turns_per_s": statistics.median(r["turns_per_s"] for r in rows),
        }
    return out


def _dig(row: dict, keys: tuple) -> list:
    for k in keys:
        row = row[k]
    return row


def markdown(meta: dict, summary: dict) -> str:
    lines = [f"# Talker admission benchmark — {meta['date']}", "",
             f"Device: {meta['device']}; torch {meta['torch']} ({meta['torch_threads']} threads), Python "
             f"{meta['python']}; commit {meta['commit']}.", "", f"Command: `{meta['command']}`", "",
             "Spoken turns with a scripted reply; medians over every turn of all rounds. Steps = engine steps "
             "(`Engine._step`) between the two marks; `_start` = engine-thread host ms per talker job started, "
             "`_admit` = per admission pass that started at least one job.", "",
             "| N | turns | segment→talker step ms (steps, max) | talker step→PCM ms (steps) | segment→PCM ms (steps) "
             "| engine step ms | `_start` ms p50 / p90 (jobs) | `_admit` ms p50 / p90 | turns/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    keys = [f"{a.value}->{b.value}" for a, b in _GAPS]
    for n, s in summary.items():
        cells = []
        for k in keys:
            g = s["gaps"].get(k)
            cells.append("–" if g is None else f"{g['ms_p50']:.1f} ({g['steps_p50']:g}, max {g['steps_max']})")
        lines.append(f"| {n} | {s['turns']} | " + " | ".join(cells) + f" | {s['step_ms_p50']:.1f} | "
                     f"{s['start_ms_p50']:.2f} / {s['start_ms_p90']:.2f} ({s['starts']}) | "
                     f"{s['admit_ms_p50']:.2f} / {s['admit_ms_p90']:.2f} | {s['turns_per_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.talker_admission", description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--waves", type=int, default=2, help="1: a burst of N turns; W > 1: closed loop until N x W ran")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--steps-per-word", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave torch's default)")
    ap.add_argument("--config", default=None, help="a server config whose engine section to use (GPU runs)")
    ap.add_argument("--set", action="append", default=[], help="config overrides a.b=c (of --config, else of the tiny CPU engine)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    levels = [int(v) for v in args.levels.split(",")]
    date = datetime.date.today().isoformat()
    out = Path(args.out) if args.out else REPO / "bench" / "results" / f"cpu-talker-admission-{date}"
    cfg = bench_engine_config(args.config, args.set, levels)
    engine = Engine.create(cfg, hooks=bench_hooks(args.steps_per_word))
    if engine._talker is None:
        raise SystemExit("this engine has no talker")
    probe, clock = AdmissionProbe(engine), StepClock()
    samples = []
    try:
        run_level(engine, clock, "spoken", max(levels), -1, args.max_tokens)  # warm the largest shapes
        for r in range(args.rounds):
            for n in levels:
                probe.reset()
                s = run_level(engine, clock, "spoken", n, r, args.max_tokens, args.waves)
                samples.append({"n": n, "round": r, "turns_per_s": s["turns_per_s"], **probe.sample()})
                print(f"round {r} N={n}: {s['turns_per_s']:.2f} turns/s", flush=True)
    finally:
        engine.close()
    summary = summarise(samples)
    meta = {"date": date, "device": (torch.cuda.get_device_name() + f", host {_cpu_model()}"
                                     if torch.cuda.is_available() else f"{_cpu_model()} ({os.cpu_count()} CPUs)"),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "commit": _commit(),
            "command": "python -m bench.talker_admission " + " ".join(argv if argv is not None else sys.argv[1:]),
            "engine_config": dataclasses.asdict(cfg)}
    write_results(out, "talker_admission", meta, summary, samples, markdown(meta, summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
