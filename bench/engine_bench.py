"""Engine benchmark (issue 3): N concurrent turns through `Engine`, N = 1, 4, 16 — the tiny model on the CPU,
or any engine config (e.g. the full-size shapes on a GPU with --config).

    python -m bench.engine_bench [--levels 1,4,16] [--modes spoken,text] [--rounds 3] [--max-tokens 32]
                                 [--steps-per-word 2] [--waves 1] [--length-spread 0] [--stagger-ms 0]
                                 [--threads 0] [--out DIR] [--config FILE --set a.b=c ...]

Every turn has a fixed amount of work: the thinker emits `--max-tokens` tokens of a scripted reply
(`forced_reply`, so the segmenter and talker see real words; every model computation still runs);
spoken turns add the talker at `--steps-per-word` steps per word, text turns are thinker only.
Identical turns submitted together stay in lockstep (each wave prefills, decodes and speaks as one cohort);
`--length-spread F` draws each turn's tokens from max_tokens x [1 - F, 1 + F] (seeded by its index, the mean
kept) and `--stagger-ms` spreads the first N submissions over that many ms, so a closed loop reaches a steady
state of turns at every phase.
Reports per mode and level: medians of each stage mark relative to SUBMITTED, aggregate throughput
(thinker tokens/s, audio s per wall s, turns/s) and where the engine thread spent its time.
Writes engine_bench.json and engine_bench.md into --out (default bench/out/engine-<date>/, git-ignored).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch

from realtime_ming.engine import Engine
from realtime_ming.engine.api import (
    OUTPUT_SAMPLE_RATE_HZ,
    Content,
    Message,
    SamplingParams,
    Stage,
    TurnCancelled,
    TurnDone,
    TurnFailed,
    TurnRequest,
)
from realtime_ming.engine.config import (
    EngineConfig,
    TalkerRunnerConfig,
    ThinkerRunnerConfig,
)
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.talker_process import ProcessTalker

from bench.loop_stats import LOOP_HEADER, loop_members, loop_rates, loop_row, loop_totals
from bench.torch_trace import profile_round

__all__ = ["main", "run_level"]

REPLY = ("Sure. The weather today looks sunny, with a light breeze from the west and a high of twenty degrees. "
         "Later in the evening a few clouds may drift in, but no rain is expected before tomorrow.")
PROMPTS = ("Hello, how are you today?", "What will the weather be like?", "Tell me something about the sea.",
           "Can you recommend a good book?")
STAGES = (Stage.ENCODERS_DONE, Stage.PREFILL_DONE, Stage.FIRST_TOKEN, Stage.FIRST_SEGMENT, Stage.FIRST_TALKER_STEP,
          Stage.FIRST_PCM, Stage.THINKER_DONE, Stage.DONE)


class StepClock:
    """Wall time of the engine thread's parts, by wrapping the callables it steps (profiling only)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        # per label, what its `rows` / `tally` counts: talker streams per step, thinker launches with a prefill chunk
        self.rows: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()  # talker replicas on threads of their own add to the same labels

    def wrap(self, owner, name: str, label: str, rows=None, tally=None) -> None:
        """Time `owner.name` under `label`; `rows()` (before each call) or `tally(result)` (after it) adds to
        `self.rows[label]`."""
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            n = rows() if rows is not None else 0
            t0 = time.perf_counter()
            try:
                result = inner(*args, **kwargs)
                n += tally(result) if tally is not None else 0
                return result
            finally:
                with self._lock:
                    self.rows[label] += n
                    self.seconds[label] += time.perf_counter() - t0
                    self.calls[label] += 1

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.rows.clear()


def instrument(engine: Engine) -> StepClock:
    clock = StepClock()
    thinker, talker = engine._thinker, engine._talker
    # queues the thinker's GPU work; rows: the launches with a prefill chunk (which reads every MoE expert)
    clock.wrap(thinker, "launch", "thinker_launch", tally=lambda step: int(bool(step.chunk)))
    clock.wrap(thinker, "collect", "thinker_collect")  # waits for it (after the talker's step)
    members = getattr(talker, "members", [talker])  # a talker pool: each replica's driver, summed per label
    if any(isinstance(m, ProcessTalker) for m in members):
        return clock  # engine.talker.driver: process: the talker's time is spent in other processes, not clocked here
    runners = [m.runner for m in members]
    # the engine thread steps the talker (a pool: every replica's step in one call)
    clock.wrap(talker, "launch", "talker_launch")  # starts jobs, queues the step's graph
    clock.wrap(talker, "outputs", "talker_finish")  # waits for it: stop decisions, VAE chunk, PCM
    for runner in runners:
        clock.wrap(runner, "_launch_advance", "talker_advance", rows=runner.num_streams)  # runs only with streams
        clock.wrap(runner.talker, "prefill", "talker_prefill")
        clock.wrap(runner.talker, "decode_lm", "talker_lm")
        clock.wrap(runner.talker, "tail_step", "talker_cfm_tail")
        clock.wrap(runner, "vae_step", "vae_chunk")
    return clock


def turn_tokens(index: int, max_tokens: int, spread: float) -> int:
    """Turn `index`'s thinker tokens: max_tokens, or with `spread` uniform in max_tokens x [1 - spread, 1 + spread]
    (seeded by the index: every run and every engine get the same lengths)."""
    if spread <= 0:
        return max_tokens
    return max(1, round(max_tokens * (1.0 + spread * random.Random(index).uniform(-1.0, 1.0))))


def _request(turn_id: str, index: int, max_tokens: int, with_audio: bool, spread: float = 0.0) -> TurnRequest:
    max_tokens = turn_tokens(index, max_tokens, spread)
    text = PROMPTS[index % len(PROMPTS)]
    return TurnRequest(turn_id, turn_id, (Message("user", (Content.of_text(text),)),), with_audio=with_audio,
                       sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=index))


def run_level(engine: Engine, clock: StepClock, mode: str, n: int, round_index: int, max_tokens: int,
              waves: int = 1, spread: float = 0.0, stagger_ms: float = 0.0) -> dict:
    """n turns in flight until n x waves have run (waves 1: one burst of n submitted at once; more: a closed
    loop, each finished turn replaced by a new one; `spread` / `stagger_ms`: `turn_tokens`, the first n submitted
    over that many ms); returns the level's measurements."""
    done = threading.Event()
    results: dict[str, object] = {}
    lock = threading.Lock()
    total = n * waves
    ids = [f"{mode}-r{round_index}-n{n}-{i}" for i in range(total)]
    submitted = [n]

    def sink(event):
        if isinstance(event, (TurnDone, TurnFailed, TurnCancelled)):
            with lock:
                results[event.turn_id] = event
                if submitted[0] < total:  # closed loop: the next turn takes the finished one's place
                    i = submitted[0]
                    submitted[0] += 1
                    engine.submit(_request(ids[i], i, max_tokens, mode == "spoken", spread), sink)
                if len(results) == total:
                    done.set()

    clock.reset()
    loops_before = loop_totals(loop_members(engine._talker))
    t0 = time.monotonic()
    for i, turn_id in enumerate(ids[:n]):
        if stagger_ms > 0 and i:
            time.sleep(stagger_ms / 1e3 / n)
        engine.submit(_request(turn_id, i, max_tokens, mode == "spoken", spread), sink)
    if not done.wait(600):
        raise RuntimeError(f"{mode} N={n}: only {len(results)} of {total} turns finished")
    wall = time.monotonic() - t0
    loops = loop_rates(loops_before, loop_totals(loop_members(engine._talker)), wall)
    for turn_id in ids:
        engine.close_conversation(turn_id)
    failed = [r for r in results.values() if not isinstance(r, TurnDone)]
    if failed:
        raise RuntimeError(f"{mode} N={n}: {failed[0]}")
    turns = [results[t] for t in ids]
    stages = {s.value: [1000 * (d.stages[s] - d.stages[Stage.SUBMITTED]) for d in turns if s in d.stages]
              for s in STAGES}
    tokens = sum(d.output_tokens for d in turns)
    # the thinker's own span: first admission to the last turn's final token
    thinker_span = max(d.stages[Stage.THINKER_DONE] for d in turns) - min(d.stages[Stage.SUBMITTED] for d in turns)
    audio_s = sum(d.audio_samples for d in turns) / OUTPUT_SAMPLE_RATE_HZ
    return {
        "mode": mode, "n": n, "turns": total, "round": round_index, "wall_s": wall, "tokens": tokens, "audio_s": audio_s,
        "thinker_tok_per_s": tokens / thinker_span, "audio_s_per_wall_s": audio_s / wall, "turns_per_s": total / wall,
        "stages_ms": stages, "engine_thread_s": dict(clock.seconds), "calls": dict(clock.calls),
        "mean_talker_streams": clock.rows["talker_advance"] / max(1, clock.calls["talker_advance"]),
        "chunk_share": clock.rows["thinker_launch"] / max(1, clock.calls["thinker_launch"]),
        "talker_loops": loops,
    }


def summarise(samples: list[dict]) -> dict:
    """Per mode and level: medians over rounds of throughput and thread time, over every turn of each stage."""
    out: dict = {}
    for mode, n in sorted({(s["mode"], s["n"]) for s in samples}):
        rows = [s for s in samples if s["mode"] == mode and s["n"] == n]
        med = lambda key, rows=rows: statistics.median(r[key] for r in rows)
        labels = sorted({k for r in rows for k in r["calls"]})
        thread = {k: statistics.median(r["engine_thread_s"].get(k, 0.0) for r in rows) for k in labels}
        calls = {k: statistics.median(r["calls"].get(k, 0) for r in rows) for k in labels}
        out.setdefault(mode, {})[n] = {
            "wall_s": med("wall_s"), "thinker_tok_per_s": med("thinker_tok_per_s"),
            "audio_s_per_wall_s": med("audio_s_per_wall_s"), "turns_per_s": med("turns_per_s"),
            "audio_s_per_turn": statistics.median(r["audio_s"] / r.get("turns", n) for r in rows),
            "mean_talker_streams": med("mean_talker_streams"), "chunk_share": med("chunk_share"),
            "stages_ms": {st: statistics.median(v for r in rows for v in r["stages_ms"][st])
                          for st in rows[0]["stages_ms"] if any(r["stages_ms"][st] for r in rows)},
            "engine_thread_s": thread, "calls": calls,
            "ms_per_call": {k: 1000 * thread[k] / calls[k] for k in labels if calls[k]},
            "talker_loops": {k: statistics.median(r["talker_loops"][k] for r in rows)
                             for k in (rows[0].get("talker_loops") or {})},
        }
    return out


_THREAD_KEYS = ("thinker_launch", "thinker_collect", "talker_launch", "talker_finish", "talker_prefill", "talker_lm",
                "talker_cfm_tail", "vae_chunk")


def _mode_markdown(mode: str, summary: dict, process: bool = False) -> list[str]:
    levels = sorted(summary)
    base = summary[levels[0]]
    lines = [f"## {mode} turns: throughput", "",
             "| N | wall s | thinker tok/s | audio s / wall s | turns/s | audio s per turn | talker streams/step |",
             "|---|---|---|---|---|---|---|"]
    for n in levels:
        s = summary[n]
        lines.append(f"| {n} | {s['wall_s']:.2f} | {s['thinker_tok_per_s']:.0f} | {s['audio_s_per_wall_s']:.2f} | "
                     f"{s['turns_per_s']:.2f} | {s['audio_s_per_turn']:.2f} | {s['mean_talker_streams']:.1f} |")
    lines += ["", f"vs N = {levels[0]}: " + "; ".join(
        f"N={n}: thinker tok/s ×{summary[n]['thinker_tok_per_s'] / base['thinker_tok_per_s']:.2f}, "
        f"turns/s ×{summary[n]['turns_per_s'] / base['turns_per_s']:.2f}" for n in levels[1:]), "",
              f"## {mode} turns: stage marks (median ms after SUBMITTED, every turn)", "",
              "| N | " + " | ".join(st.value for st in STAGES) + " |", "|---|" + "---|" * len(STAGES)]
    for n in levels:
        st = summary[n]["stages_ms"]
        lines.append(f"| {n} | " + " | ".join(f"{st[s.value]:.0f}" if s.value in st else "–" for s in STAGES) + " |")
    lines += ["", f"## {mode} turns: engine thread, ms per call (calls), median round", "",
              "| N | " + " | ".join(_THREAD_KEYS) + " | busy / wall | thinker steps with a prefill chunk |",
              "|---|" + "---|" * (len(_THREAD_KEYS) + 2)]
    for n in levels:
        per, calls, thread = summary[n]["ms_per_call"], summary[n]["calls"], summary[n]["engine_thread_s"]
        keys = _THREAD_KEYS[:2] if process else _THREAD_KEYS[:4]  # a talker in its own process is not this thread's
        busy = sum(thread.get(k, 0.0) for k in keys) / summary[n]["wall_s"]
        lines.append(f"| {n} | " + " | ".join(f"{per[k]:.1f} ({calls[k]:.0f})" if k in per else "–" for k in _THREAD_KEYS)
                     + f" | {busy:.2f} | {summary[n].get('chunk_share', 0.0):.0%} |")
    if any(summary[n].get("talker_loops") for n in levels):
        lines += ["", f"## {mode} turns: talker loops (per replica but jobs/s; median round)", "",
                  "| N " + LOOP_HEADER[0], "|---" + LOOP_HEADER[1]]
        lines += [f"| {n} | {loop_row(summary[n]['talker_loops'])} |" for n in levels if summary[n].get("talker_loops")]
    return lines + [""]


def markdown(meta: dict, summary: dict) -> str:
    device = (f"Device: {meta['device']}; torch {meta['torch']} ({meta['torch_threads']} intra-op threads), "
              f"Python {meta['python']}; commit {meta['commit']}; load average at start {meta['loadavg'][0]:.2f}.")
    ec = meta["engine_config"]
    model = ("embedded tiny random-weight Ming" if ec.get("preset") in (None, "tiny") and not ec.get("model_path")
             else f"{ec.get('preset') or ec.get('model_path')} ({ec.get('weights')} {ec.get('dtype')} weights"
                  + (f", thinker as one rank of TP={meta['tp_shadow']} with collectives skipped"
                     if meta.get("tp_shadow", 1) > 1 else "") + ")")
    spread = meta.get("length_spread", 0.0)
    tokens = (f"{meta['max_tokens']}" if not spread else
              f"{meta['max_tokens']} x [{1 - spread:.2f}, {1 + spread:.2f}] (seeded per turn)")
    work = (f"Model: {model}. Every turn: {tokens} thinker tokens (forced reply, "
            f"ignore_eos); spoken turns add the talker at {meta['steps_per_word']} steps per word"
            + (f" ({len(meta['talker_devices'])} talker replicas, on {', '.join(meta['talker_devices'])}: "
               "talker streams/step and the talker rows of the thread table are per replica step)"
               if len(meta.get("talker_devices") or []) > 1 else "") + ". "
            + ("N turns are submitted at once" if meta.get("waves", 1) == 1 else
               f"N turns in flight, closed loop: each finished turn is replaced at once until N × {meta['waves']} "
               "have run (turns/s = all of them / wall)")
            + (f"; the first N submitted over {meta['stagger_ms']:.0f} ms" if meta.get("stagger_ms") else "")
            + f"; {meta['rounds']} rounds per level, levels interleaved; medians.")
    legend = ("thinker tok/s = output tokens / (first SUBMITTED → last THINKER_DONE); audio s / wall s and turns/s "
              "over the level's wall time. Engine thread, per engine step: `talker_launch` starts talker jobs and queues "
              "the talker's step, `thinker_collect` waits for the thinker step in flight and takes its tokens, "
              "`thinker_launch` queues the next thinker step (the share of those with a prefill chunk, alone or beside "
              "decode rows, in the last column: a chunk reads every MoE expert), `talker_finish` waits for the talker's step (stop "
              "decisions, `vae_chunk`, PCM); `talker_prefill` starts one talker job; `talker_lm` / `talker_cfm_tail` "
              "show only when the talker runs eagerly."
              + (" The talker steps in a process of its own per replica (`engine.talker.driver: process`): busy / wall "
                 "counts the thinker's two alone. Talker loops: per replica, launches per second, ms per launch in "
                 "`launch` (starting jobs, queuing steps) and in `finish` (waiting for the steps, stop decisions, VAE, "
                 "PCM), the share of wall time idle and streams per step; jobs started per second over all replicas "
                 "and the host ms to start one." if _process(ec) else ""))
    lines = [f"# Engine benchmark — {meta['date']}", "", device, "", f"Command: `{meta['command']}`", "",
             work, "", legend, ""]
    for mode, levels in summary.items():
        lines += _mode_markdown(mode, levels, _process(ec))
    return "\n".join(lines)


def _process(engine_config: dict) -> bool:
    """Whether the benchmarked engine stepped its talker in processes of its own (`engine.talker.driver`)."""
    return (engine_config.get("talker") or {}).get("driver") == "process"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"




def write_results(out: Path, stem: str, meta: dict, summary: dict, samples: list, md: str) -> None:
    """`out/<stem>.json` (meta, summary, every sample) and `out/<stem>.md` (`md`, also printed)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "summary": summary, "samples": samples},
                                                 indent=1, default=str))
    (out / f"{stem}.md").write_text(md)
    print(md)
    print(f"wrote {out}/{stem}.json and {stem}.md")

def bench_hooks(steps_per_word: int, tp_shadow: int = 1) -> EngineHooks:
    """The hooks of a benchmark: the scripted reply, fixed-length talker turns (`steps_per_word`), and with
    `tp_shadow` > 1 the thinker as one rank of TP=tp_shadow alone on its GPU."""
    return EngineHooks(forced_reply=REPLY, steps_per_word=steps_per_word, tp_shadow=tp_shadow)


def bench_engine_config(config: str | None, overrides: list[str], levels: list[int]) -> EngineConfig:
    """The engine config of a benchmark: `config`'s engine section (with `overrides`), else the tiny CPU model
    (with `overrides`, e.g. engine.placement.talker_devices=[cpu,cpu]); either way slots and talker streams (per
    talker replica) for the largest level (the scripted reply and talker length are `bench_hooks`)."""
    if config or overrides:
        from realtime_ming.server import load_config

        # the tiny model's own default: 1024-token slots, unless an override says otherwise
        base = load_config(config, overrides if config else ["engine.thinker.max_seq_len=1024", *overrides]).engine
        return dataclasses.replace(
            base, thinker=dataclasses.replace(base.thinker, max_slots=max(*levels, base.thinker.max_slots)),
            talker=dataclasses.replace(base.talker, max_streams=max(*levels, base.talker.max_streams)))
    return EngineConfig(thinker=ThinkerRunnerConfig(max_slots=max(levels), max_seq_len=1024),
                        talker=TalkerRunnerConfig(max_streams=max(levels)))

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,4,16", help="concurrent turns per level, comma separated")
    ap.add_argument("--modes", default="spoken,text", help="spoken (thinker + talker) and/or text (thinker only)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--steps-per-word", type=int, default=2)
    ap.add_argument("--tp-shadow", type=int, default=1, help="N > 1: the thinker as rank 0 of TP=N alone on its "
                    "GPU, collectives skipped (dummy weights): a TP=N deployment's per-GPU cost on one GPU")
    ap.add_argument("--waves", type=int, default=1, help="1: each level is one burst of N turns; W > 1: a closed "
                    "loop keeping N turns in flight until N x W have run (steady-state throughput)")
    ap.add_argument("--length-spread", type=float, default=0.0, help="each turn's tokens uniform in max_tokens x "
                    "[1 - F, 1 + F] (seeded by its index): turns desynchronise instead of running as cohorts")
    ap.add_argument("--stagger-ms", type=float, default=0.0, help="the first N submissions spread over this many ms")
    ap.add_argument("--profile", action="store_true", help="last, one more closed-loop round of the largest level "
                    "under torch.profiler: the host calls and kernels with the most time -> profile.md, trace.json.gz")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave torch's default)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--config", default=None, help="a server config whose engine section to use (e.g. "
                    "bench/configs/shadow-tp2-1gpu.yaml on a GPU); default: the tiny CPU engine")
    ap.add_argument("--set", action="append", default=[], help="config overrides a.b=c (of --config, else of the "
                    "tiny CPU engine), e.g. --set 'engine.placement.talker_devices=[cuda:2,cuda:3]'")
    args = ap.parse_args(argv)
    if not 0.0 <= args.length_spread < 1.0 or args.stagger_ms < 0:
        ap.error("--length-spread takes [0, 1), --stagger-ms >= 0")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    levels = [int(v) for v in args.levels.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - {"spoken", "text"}:
        ap.error("--modes takes spoken and/or text")
    date = datetime.date.today().isoformat()
    out = Path(args.out) if args.out else REPO / "bench" / "out" / f"engine-{date}"
    cfg = bench_engine_config(args.config, args.set, levels)
    load_at_start = os.getloadavg()
    t = time.monotonic()
    engine = Engine.create(cfg, hooks=bench_hooks(args.steps_per_word, args.tp_shadow))  # includes a warm-up turn
    print(f"engine ready in {time.monotonic() - t:.1f} s", flush=True)
    talker_devices = engine.info().get("talker_devices", [])
    clock = instrument(engine)
    samples = []
    try:
        for mode in modes:
            run_level(engine, clock, mode, max(levels), -1, args.max_tokens)  # warm the largest batch shapes too
        for r in range(args.rounds):
            for mode in modes:
                for n in levels:
                    s = run_level(engine, clock, mode, n, r, args.max_tokens, args.waves, args.length_spread,
                                  args.stagger_ms)
                    samples.append(s)
                    print(f"round {r} {mode:>6} N={n:>2}: wall {s['wall_s']:.2f} s, thinker {s['thinker_tok_per_s']:.0f} "
                          f"tok/s, {s['audio_s_per_wall_s']:.2f} audio s/s, {s['turns_per_s']:.2f} turns/s", flush=True)
        if args.profile:
            n, waves = max(levels), max(2, args.waves)
            profile_round(engine._thread, lambda: run_level(engine, clock, modes[0], n, 99, args.max_tokens, waves),
                          f"engine_bench profile: {modes[0]} N={n}, closed loop x{waves}", out)
    finally:
        engine.close()
    summary = summarise(samples)
    meta = {
        "date": date, "device": (torch.cuda.get_device_name() + f", host {_cpu_model()}" if torch.cuda.is_available()
                                 else f"{_cpu_model()} ({os.cpu_count()} CPUs visible)"), "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(), "commit": _commit(),
        "command": "python -m bench.engine_bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "max_tokens": args.max_tokens, "steps_per_word": args.steps_per_word, "tp_shadow": args.tp_shadow, "rounds": args.rounds, "waves": args.waves,
        "length_spread": args.length_spread, "stagger_ms": args.stagger_ms,
        "levels": levels, "modes": modes, "engine_config": dataclasses.asdict(cfg), "loadavg": load_at_start,
        "talker_devices": talker_devices,
    }
    write_results(out, "engine_bench", meta, summary, samples, markdown(meta, summary))
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(main())
