"""The whole thinker's graphed decode step on one GPU with FP8 experts, A/B of decode plans in one process.

    python -m bench.fp8_step_ab --out DIR --plans base,shipped,DIR/fp8_plan.json [--batches 1,16,64] [--profile 1]
    python -m bench.fp8_step_ab --out DIR --plans shipped,shipped+step=DIR/step_plan.json   # + a step plan
    python -m bench.fp8_step_ab --out DIR --plans shipped+nopdl,shipped --rounds 3   # PDL off / on, in turn x 3
    python -m bench.fp8_step_ab --out DIR --plans base,shipped --dry-run      # CPU, tiny preset: plumbing only

tp_bench.py's method (its builder, step, timing and bytes floor: `tp_bench.py --tp 1 --expert-dtype fp8
--stages decode,floor`, dummy weights, every row its own slot at a different length), with the thinker built once
and, per plan (bench/fp8_variants.py: base, shipped or a JSON plan, `+pdl`), the decode plan put in force, the
buckets captured again and timed (`--rounds`: the plans in turn that many times, each batch's median reported);
`--profile` buckets also run under torch.profiler (bench/step_profile.py: where the step's time goes). Writes
DIR/fp8_step_ab.{json,md}; prints the compact table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fp8_variants  # noqa: E402
import step_profile  # noqa: E402
import tp_bench  # noqa: E402
from tp_report import Report  # noqa: E402

from realtime_ming.engine.graphs import BucketedGraph  # noqa: E402
from realtime_ming.model.kernels import step_plan  # noqa: E402
from realtime_ming.model.layers import TPGroup  # noqa: E402
from realtime_ming.model.thinker import ThinkerKVCache  # noqa: E402


def _greedy(run, batch: int, args, device) -> list[int]:
    """Row 0's first 8 greedy tokens from a fixed start (same for every plan: a parity glance, not a test)."""
    slots = torch.arange(batch, device=device)
    pos0 = (args.prompt_tokens + args.audio_tokens + tp_bench.ROW_STRIDE * slots)[:, None]
    first = torch.arange(batch, device=device) + 100
    return tp_bench._generate(run, first, pos0, slots, 8)[0].tolist()


def _save(out: Path, res: dict) -> None:
    """Write what is measured so far (a run cut off by its time limit keeps its plans' numbers)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8_step_ab.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "fp8_step_ab.md").write_text(markdown(res))


def run_plans(args, plans: list[str], profile: list[int], log, res: dict) -> dict:
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    cfg = tp_bench._thinker_config(args)
    t = time.perf_counter()
    thinker = tp_bench._build_shard(cfg, args, TPGroup(), device, dtype)
    cache = ThinkerKVCache.allocate(cfg, max(args.batches), args.kv_len, device=device, dtype=dtype)
    tp_bench._sync(device)
    res.update(build_s=round(time.perf_counter() - t, 1), plans={}, floor={})
    log(f"built in {res['build_s']} s")
    report = Report(Path(args.out), {}, enabled=False)
    bench = tp_bench.Bench(thinker, cache, args, device, dtype, report)
    with torch.no_grad():
        for rnd in range(args.rounds):  # the plans in turn, `rounds` times: a drift of the GPU hits every plan alike
            for spec in plans:
                _measure(spec, rnd, bench, args, device, profile if rnd == 0 else [], log, res)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                _save(Path(args.out), res)
        bench.floor()
    res["floor"] = report.data.get("floor", {})
    _save(Path(args.out), res)
    return res


def _measure(spec: str, rnd: int, bench, args, device, profile: list[int], log, res: dict) -> None:
    """One round of plan SPEC: put it in force, capture the buckets, time each batch (its `graph_ms`: the median over
    the rounds so far); in round 0 also row 0's greedy tokens and the `profile` batches under the profiler."""
    plan = fp8_variants.apply(spec)
    row = res["plans"].setdefault(spec, {"plan": fp8_variants.to_json(plan), "decode": {}, "profile": {},
                                         "step_plan": step_plan.to_json(step_plan.step_plan())})
    graph = BucketedGraph(bench.step, tp_bench._decode_specs(max(args.batches)), args.batches, device=device,
                          enforce_eager=not args.graphs)
    t = time.perf_counter()
    graph.capture()
    row.setdefault("capture_s", round(time.perf_counter() - t, 1))
    for batch in args.batches:
        ms = tp_bench._time_decode(graph.step, batch, args, device, args.steps)
        d = row["decode"].setdefault(batch, {"rounds_ms": [], "paths": plan.path(batch)})
        d["rounds_ms"].append(ms)
        d["graph_ms"] = tp_bench._median(d["rounds_ms"])
        d.update(tok_s_per_stream=1e3 / d["graph_ms"], tok_s_aggregate=batch * 1e3 / d["graph_ms"])
        log(f"{spec} round {rnd} B={batch}: {ms:.3f} ms a step ({plan.path(batch)}), {1e3 / ms:.1f} tok/s per stream")
    if rnd == 0:
        row["greedy_b1"] = _greedy(graph.step, 1, args, device)
    graph.release()
    for batch in profile:
        one = BucketedGraph(bench.step, tp_bench._decode_specs(batch), (batch,), device=device,
                            enforce_eager=not args.graphs)
        one.capture()
        slots = torch.arange(batch, device=device)
        pos = (args.prompt_tokens + args.audio_tokens + tp_bench.ROW_STRIDE * slots)[:, None]
        tok = torch.randint(0, 1000, (batch, 1), device=device)
        row["profile"][batch] = step_profile.kernel_profile(lambda: one.step(tok=tok, pos=pos, slots=slots))
        log(f"{spec} profile B={batch}: " + step_profile.markdown(row["profile"][batch])[0])
        one.release()
        if device.type == "cuda" and not row["profile"][batch]["launches_per_step"]:
            # no kernel recorded inside the graph replays (a profiler without graph-kernel tracing): the same step
            # eager, where every launch is recorded (its wall time includes the host's launches)
            row["profile"][f"{batch} eager"] = step_profile.kernel_profile(lambda: bench.step(tok, pos, slots))
            log(f"{spec} profile B={batch} eager: " + step_profile.markdown(row["profile"][f"{batch} eager"])[0])


def _name(spec: str) -> str:
    """A plan's short name: its files' names (`fp8_plan.json+step=step_plan.json`)."""
    return "+step=".join(Path(p).name for p in spec.split("+step="))


def markdown(res: dict) -> str:
    base = next(iter(res["plans"].values()), {}).get("decode", {})
    lines = ["| plan | B | path | graph ms (median) | rounds ms | tok/s per stream | tok/s aggregate | vs first plan "
             "| bytes floor ms |", "|---|---|---|---|---|---|---|---|---|"]
    for spec, row in res["plans"].items():
        for b, d in row["decode"].items():
            floor = (res["floor"].get(b) or res["floor"].get(str(b)) or {}).get("floor_ms")
            ref = (base.get(b) or {}).get("graph_ms")
            rounds = " ".join(f"{ms:.3f}" for ms in d.get("rounds_ms", ()))
            lines.append(f"| {_name(spec)} | {b} | {d['paths']} | {d['graph_ms']:.3f} | {rounds} | "
                         f"{d['tok_s_per_stream']:.1f} | {d['tok_s_aggregate']:.0f} | {ref / d['graph_ms']:.2f}x | "
                         f"{'—' if floor is None else f'{floor:.2f}'} |")
    lines += ["", "Row 0's first 8 greedy tokens at B=1 per plan: "
              + "; ".join(f"{_name(s)} {r.get('greedy_b1')}" for s, r in res["plans"].items())]
    for spec, row in res["plans"].items():
        for b, prof in row["profile"].items():
            lines += ["", f"### {_name(spec)}, B={b}: the graphed step under the profiler", ""]
            lines += step_profile.markdown(prof)
    return "\n".join(lines) + "\n"


def key_lines(res: dict) -> list[str]:
    """One line a plan and batch (median ms, tok/s per stream, against the first plan) and one a profile's headline:
    the numbers a run is read for, printed last."""
    first = next(iter(res["plans"].values()), {}).get("decode", {})
    lines = []
    for spec, row in res["plans"].items():
        for b, d in row["decode"].items():
            ref = (first.get(b) or {}).get("graph_ms")
            lines.append(f"key: {_name(spec)} B={b}: {d['graph_ms']:.3f} ms a step ({d['tok_s_per_stream']:.1f} tok/s "
                         f"per stream), {ref / d['graph_ms']:.3f}x the first plan, rounds "
                         + " ".join(f"{ms:.3f}" for ms in d.get("rounds_ms", ())))
        for b, prof in row["profile"].items():
            lines.append(f"key: {_name(spec)} profile B={b}: " + step_profile.markdown(prof)[0])
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--plans", default="base,shipped", help="comma-separated: base, shipped or JSON plan files")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--profile", default="1", help="batches also run under the profiler ('' for none)")
    ap.add_argument("--kv-len", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="times each plan is captured and timed, the plans in turn "
                    "(graph ms: the median over the rounds)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny preset, eager: plumbing only")
    a = ap.parse_args(argv)
    plans = [p for p in a.plans.split(",") if p]
    for spec in plans:
        fp8_variants.load(spec)  # a bad name fails before the build
    targs = ["--out", a.out, "--tp", "1", "--expert-dtype", "fp8", "--batches", a.batches, "--kv-len", str(a.kv_len),
             "--steps", str(a.steps), "--reps", str(a.reps)]
    if a.dry_run:
        targs += ["--device", "cpu", "--preset", "tiny"]
    args = tp_bench._parse(targs)
    args.rounds = max(1, a.rounds)
    profile = [int(b) for b in a.profile.split(",") if b]
    t0 = time.time()

    def log(text):
        print(f"[{time.time() - t0:6.1f} s] {text}", flush=True)

    res = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (dry run)",
           "date": datetime.date.today().isoformat(), "torch": torch.__version__, "command": " ".join(sys.argv)}
    run_plans(args, plans, profile, log, res)
    print(markdown(res))
    print("\n".join(key_lines(res)))


if __name__ == "__main__":
    main()
