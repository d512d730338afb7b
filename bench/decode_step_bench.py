"""The decode step's kernels outside the experts, at the real shapes on one GPU: the dense GEMV's tiles against
cuBLAS per projection and row count, the rotary's heads a program, the router's launch shapes, and the step plan
(model/kernels/step_plan.py) they pick.

    python -m bench.decode_step_bench --out DIR [--rows 1,2,4,8]
    python -m bench.decode_step_bench --out DIR --dry-run      # CPU, Triton's interpreter, tiny shapes: plumbing

* gemv: each of the thinker's dense projections (QKV, O, layer 0's gate|up and down, the LM head; TP=1) at each row
  count, cuBLAS (F.linear) against every candidate tile of `dense_gemv.gemv`, µs graphed; the weight cycles over
  copies worth >= 256 MB so every call reads HBM as in the step (the H200's L2 holds 50 MB: a QKV weight repeated
  would be served from it). A tile whose output is off F.linear's by more than bf16 rounding is reported, not picked.
* rotary: `head_rotary` of a decode step (q/k norm, partial rotary, cache write) per batch and heads a program.
* router: `moe_decode.route` per batch and (split-K, experts a program, selection warps).
* moe down: one MoE layer's FP8 GEMVs (moe_fp8.moe_decode, routed + shared, bench/fp8_decode_bench.py's layer) per
  row count with the shipped tiles against the down GEMV reading a token's experts in one tile (`dn_all` tiles).
Writes DIR/decode_step_bench.{json,md} and the picked plans: DIR/step_plan.json (everything),
DIR/step_plan_gemv.json (only the GEMV tiles), DIR/step_plan_launch.json (only the rotary and router shapes),
DIR/fp8_plan.json (the shipped FP8 plan with the down tiles picked), for `python -m bench.fp8_step_ab --plans
shipped,shipped+step=DIR/step_plan.json,DIR/fp8_plan.json+step=DIR/step_plan.json,...`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

if "--dry-run" in sys.argv:  # the interpreter must be chosen before Triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fp8_variants  # noqa: E402
from fp8_decode_bench import Layer, Timer  # noqa: E402
from fp8_kernel_bench import Experts  # noqa: E402

from realtime_ming.model.kernels import Kernels, dense_gemv, step_plan  # noqa: E402
from realtime_ming.model.kernels import moe_decode as md  # noqa: E402
from realtime_ming.model.kernels import moe_fp8  # noqa: E402
from realtime_ming.model.kernels.rotary import RotaryStyle, head_rotary  # noqa: E402
from realtime_ming.model.kernels.step_plan import StepPlan  # noqa: E402

# (n, k, warps, stages) without and with the tensor-core dot; register-light ones only at more rows (`_fits`)
REG_TILES = [(2, 512, 1, 3), (4, 256, 2, 3), (4, 512, 2, 3), (4, 512, 4, 4), (8, 256, 4, 3), (8, 512, 4, 3),
             (16, 256, 8, 3)]
DOT_TILES = [(16, 256, 4, 3), (32, 128, 4, 3), (32, 256, 4, 4), (64, 128, 4, 3)]
ROTARY_HEADS = [0, 1, 2, 4, 8, 16]
ROUTER_SHAPES = [(16, 32, 4), (16, 32, 1), (16, 32, 2), (32, 32, 1), (32, 16, 1), (8, 32, 1), (64, 16, 1)]
BATCHES = [1, 16, 64]  # the rotary's batches (the step A/B's); the router's: those up to md.MAX_DECODE_TOKENS
# the down GEMV with a token's experts in one tile: (rows a program, K chunk, warps, stages), <= 64 accumulators a thread
DOWN_ALL_TILES = [(4, 128, 2, 3), (4, 128, 4, 3), (2, 256, 2, 3), (8, 128, 4, 3), (4, 256, 4, 3), (2, 128, 1, 3),
                  (8, 64, 2, 4), (16, 64, 4, 3), (4, 64, 1, 4)]
PICK_MARGIN = 0.97  # a GEMV tile replaces cuBLAS only when at least 3 % faster
ROTATE_BYTES = 256 << 20


def _tile(n, k, warps, stages, dot=False) -> dict:
    return {"n": n, "k": k, "warps": warps, "stages": stages, **({"dot": True} if dot else {})}


def _fits(tile, rows: int) -> bool:
    """A register-accumulating tile holds rows x n x k fp32 accumulators over its threads: <= 64 a thread."""
    if tile.get("dot"):
        return True
    m = 1 << (rows - 1).bit_length()
    return m * tile["n"] * tile["k"] <= 64 * 32 * tile["warps"]


def projections(cfg) -> dict:
    hd = cfg.resolved_head_dim
    q, kv, d = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd, cfg.hidden_size
    return {"qkv": (q + 2 * kv, d), "o": (d, q), "dense gate|up": (2 * cfg.intermediate_size, d),
            "dense down": (d, cfg.intermediate_size), "lm head": (cfg.vocab_size, d)}


def bench_gemv(cfg, rows_list, device, dtype, timer, kernels, log) -> dict:
    out = {}
    for name, (n, k) in projections(cfg).items():
        copies = max(1, -(-ROTATE_BYTES // (n * k * 2))) if device.type == "cuda" else 1
        ws = [torch.randn(n, k, device=device, dtype=dtype) * k ** -0.5 for _ in range(copies)]
        for rows in rows_list:
            x = torch.randn(rows, k, device=device, dtype=dtype)
            truth = F.linear(x.float(), ws[0].float())
            ref = F.linear(x, ws[0])
            ref_err = float((ref.float() - truth).norm() / truth.norm())
            turn = [0]

            def cycle(fn):
                def run():
                    turn[0] = (turn[0] + 1) % copies
                    return fn(ws[turn[0]])
                return run

            row = {"cublas": {"us": round(timer(cycle(lambda w: F.linear(x, w))), 2), "rel_err": round(ref_err, 5)}}
            for cand in [_tile(*t) for t in REG_TILES] + [_tile(*t, dot=True) for t in DOT_TILES]:
                if not _fits(cand, rows):
                    continue
                key = json.dumps(cand, sort_keys=True)
                try:
                    err = float((dense_gemv.gemv(x, ws[0], cand).float() - truth).norm() / truth.norm())
                    us = timer(cycle(lambda w, c=cand: dense_gemv.gemv(x, w, c)))
                except Exception as exc:  # noqa: BLE001 - a tile that does not compile is reported and skipped
                    log(f"  {name} rows={rows} {key}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                row[key] = {"us": round(us, 2), "rel_err": round(err, 5)}
            out[f"{name} {n}x{k} rows={rows}"] = {"n": n, "k": k, "rows": rows, "times": row}
            best = min(row.items(), key=lambda kv: kv[1]["us"])
            log(f"gemv {name} {n}x{k} rows={rows}: cublas {row['cublas']['us']} us, best {best[0]} {best[1]['us']} us")
    return out


def pick_gemv(results: dict, rows_list) -> tuple:
    plan = []
    for rows in rows_list:
        tiles = {}
        for r in results.values():
            if r["rows"] != rows:
                continue
            t = r["times"]
            limit = max(2 * t["cublas"]["rel_err"], 5e-3)  # bf16 rounding; a wrong tile is never picked
            ok = [(v["us"], key) for key, v in t.items() if key != "cublas" and v["rel_err"] <= limit]
            us, key = min(ok) if ok else (float("inf"), None)
            tiles[f"{r['n']}x{r['k']}"] = json.loads(key) if key and us < PICK_MARGIN * t["cublas"]["us"] else None
        plan.append((rows, tiles))
    return tuple(plan)


def bench_rotary(cfg, device, dtype, timer, kernels, log) -> dict:
    h, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.resolved_head_dim
    rd = cfg.rotary_dim
    out = {}
    for b in BATCHES:
        qkv = torch.randn(b, 1, (h + 2 * kv) * hd, device=device, dtype=dtype)
        qn, kn = torch.ones(hd, device=device, dtype=dtype), torch.ones(hd, device=device, dtype=dtype)
        ang = torch.randn(b, 1, rd, device=device)
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        ck, cv = (torch.zeros(b, kv, 64, hd, device=device, dtype=dtype) for _ in range(2))
        rows, index = torch.arange(b, device=device), torch.full((b, 1), 5, device=device)
        out[b] = {}
        for heads in ROTARY_HEADS:
            step_plan.STEP_PLAN = StepPlan(rotary_heads=heads)
            out[b][heads] = round(timer(lambda: head_rotary(
                qkv, h, kv, hd, cos, sin, RotaryStyle.NEOX_ROUND_EACH, q_norm=qn, k_norm=kn, eps=1e-6, k_out=ck,
                v_out=cv, rows=rows, index=index, kernels=kernels)), 2)
        log(f"rotary B={b}: {out[b]} us by heads a program")
    return out


def bench_router(cfg, device, dtype, timer, kernels, log) -> dict:
    w = torch.randn(cfg.num_experts, cfg.hidden_size, device=device, dtype=dtype) * cfg.hidden_size ** -0.5
    bias = torch.randn(cfg.num_experts, device=device, dtype=dtype) * 0.05
    out = {}
    for b in [b for b in BATCHES if b <= md.MAX_DECODE_TOKENS]:
        x = torch.randn(b, cfg.hidden_size, device=device, dtype=dtype)
        out[b] = {}
        ref = None
        for splits, block_e, warps in ROUTER_SHAPES:
            step_plan.STEP_PLAN = StepPlan(router_splits=splits, router_block_e=block_e, select_warps=warps)
            run = lambda: md.route(x, w, bias, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group,  # noqa: E731
                                   cfg.routed_scaling_factor, kernels=kernels)
            ids = run()[0].sort(-1).values
            ref = ids if ref is None else ref
            same = bool(torch.equal(ids, ref))
            out[b][f"{splits}x{block_e} w{warps}"] = {"us": round(timer(run), 2), "same_experts": same}
        log(f"router B={b}: {out[b]}")
    return out


def bench_moe_down(cfg, rows_list, device, timer, kernels, log) -> dict:
    """Per row count: the shipped GEMV tiles, then the same gate|up with each `dn_all` down tile (µs, rel err)."""
    ex = Experts(1, cfg=cfg, device=str(device), dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    out = {}
    for rows in rows_list:
        layer = Layer(ex, rows, kernels, seed=rows)
        shipped = moe_fp8.decode_plan().tiles(rows)
        row = {}
        for name, tune in [("shipped", shipped)] + [
                (f"all {t}", {**shipped, "dn_all": 1, "dn_d": t[0], "dn_k": t[1], "dn_warps": t[2], "dn_stages": t[3]})
                for t in DOWN_ALL_TILES]:
            fn = layer.gemv(tune)
            try:
                err = float((fn().float() - layer.truth).norm() / layer.truth.norm())
                row[name] = {"us": round(timer(fn), 2), "rel_err": round(err, 5), "tiles": tune}
            except Exception as exc:  # noqa: BLE001 - a tile that does not compile is reported and skipped
                log(f"  moe rows={rows} {name}: {type(exc).__name__}: {str(exc)[:120]}")
        out[rows] = row
        best = min(row.items(), key=lambda kv: kv[1]["us"])
        log(f"moe down rows={rows}: shipped {row['shipped']['us']} us, best {best[0]} {best[1]['us']} us")
    return out


def pick_fp8_plan(moe: dict) -> dict:
    """The shipped FP8 plan with, per row count measured, the fastest down tile where it beats the shipped one by
    PICK_MARGIN at the shipped tiles' error (+1e-3)."""
    plan = fp8_variants.to_json(moe_fp8.decode_plan())
    for rows, row in moe.items():
        base = row["shipped"]
        ok = [v for v in row.values() if v["rel_err"] <= base["rel_err"] + 1e-3]
        best = min(ok, key=lambda v: v["us"])
        bound = next(b for b, _ in plan["gemv_tiles"] + [[10 ** 9, None]] if b >= int(rows))  # the entry rows take
        if best["us"] < PICK_MARGIN * base["us"]:
            plan["gemv_tiles"] = [[b, best["tiles"] if b == bound else t] for b, t in plan["gemv_tiles"]]
    fp8_variants.from_json(plan)
    return plan


def _pick_min(table: dict) -> object:
    """The choice with the least summed time relative to the first choice, over the batches."""
    firsts = {b: next(iter(v.values())) for b, v in table.items()}
    keys = list(next(iter(table.values())))

    def us(v):
        return v["us"] if isinstance(v, dict) else v
    ok = [k for k in keys if all(not isinstance(v[k], dict) or v[k].get("same_experts", True) for v in table.values())]
    return min(ok, key=lambda k: sum(us(table[b][k]) / us(firsts[b]) for b in table))


def markdown(res: dict) -> str:
    lines = ["| projection | rows | cuBLAS µs | best GEMV µs | tile | picked |", "|---|---|---|---|---|---|"]
    for name, r in res.get("gemv", {}).items():
        t = r["times"]
        cands = [(v["us"], k) for k, v in t.items() if k != "cublas"]
        us, key = min(cands) if cands else (float("nan"), "—")
        picked = dict(res["plan"]["gemv"]).get(r["rows"], {}).get(f"{r['n']}x{r['k']}")
        lines.append(f"| {name.rsplit(' rows=', 1)[0]} | {r['rows']} | {t['cublas']['us']:.1f} | {us:.1f} | `{key}` | "
                     f"{'GEMV' if picked else 'cuBLAS'} |")
    rotary, router = res.get("rotary", {}), res.get("router", {})
    lines += ["", "| rotary, heads a program | " + " | ".join(f"B={b}" for b in rotary) + " |",
              "|---|" + "---|" * len(rotary)]
    for heads in ROTARY_HEADS if rotary else ():
        lines.append(f"| {heads or 'all'} | " + " | ".join(f"{v[heads]:.2f}" for v in rotary.values()) + " |")
    lines += ["", "| router (split-K x experts a program, selection warps) | " + " | ".join(
        f"B={b}" for b in router) + " |", "|---|" + "---|" * len(router)]
    for shape in next(iter(router.values()), {}):
        lines.append(f"| {shape} | " + " | ".join(
            f"{v[shape]['us']:.2f}{'' if v[shape]['same_experts'] else ' (other experts!)'}"
            for v in router.values()) + " |")
    lines += ["", "| MoE layer's FP8 GEMVs, rows | shipped µs | best `dn_all` µs | its tile | rel err shipped / best |",
              "|---|---|---|---|---|"]
    for rows, row in res.get("moe_down", {}).items():
        cands = [(v["us"], k) for k, v in row.items() if k != "shipped"]
        us, key = min(cands) if cands else (float("nan"), "—")
        best_err = row[key]["rel_err"] if key in row else float("nan")
        lines.append(f"| {rows} | {row['shipped']['us']:.1f} | {us:.1f} | `{key}` | "
                     f"{row['shipped']['rel_err']:.4f} / {best_err:.4f} |")
    plan = res["plan"]
    gemv = ",\n".join(f"    ({b}, {t})" for b, t in plan["gemv"])
    lines += ["", "Step plan picked, as model/kernels/step_plan.py's `STEP_PLAN`:", "", "```python",
              f"STEP_PLAN = StepPlan(gemv=(\n{gemv},\n), rotary_heads={plan['rotary_heads']}, "
              f"router_splits={plan['router_splits']}, router_block_e={plan['router_block_e']}, "
              f"select_warps={plan['select_warps']})", "```"]
    if "fp8_plan" in res:
        lines += ["", "FP8 plan picked, as model/kernels/moe_fp8.py's `_GEMV_TILES`:", "", "```python",
                  "_GEMV_TILES = ("] + [f"    ({n}, {t})," for n, t in res["fp8_plan"]["gemv_tiles"]] + [")", "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--dry-run", action="store_true", help="CPU, Triton's interpreter, tiny shapes (plumbing only)")
    args = ap.parse_args(argv)
    rows_list = [int(v) for v in args.rows.split(",")]
    torch.manual_seed(0)
    if args.dry_run:
        from realtime_ming.model.presets import tiny_config
        from realtime_ming.model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_talker_special_ids, tiny_thinker_special_ids

        cfg = tiny_config(tiny_thinker_special_ids(), tiny_talker_special_ids(), TINY_VOCAB_SIZE).thinker
        device, kernels, timer = torch.device("cpu"), Kernels(triton=True, cpu_interpreter=True), Timer(False, 1)
        global REG_TILES, DOT_TILES, ROUTER_SHAPES, ROTARY_HEADS, BATCHES  # noqa: PLW0603 - the plumbing, not the breadth
        REG_TILES, DOT_TILES, ROUTER_SHAPES = REG_TILES[:1], DOT_TILES[:1], ROUTER_SHAPES[:2]
        DOWN_ALL_TILES[:] = [(4, 16, 1, 2)]
        ROTARY_HEADS, BATCHES = [0, 2], [1, 2]
    else:
        from realtime_ming.model.presets import preset_config

        cfg = preset_config("ming-flash-omni-2.0").thinker
        device, kernels, timer = torch.device("cuda"), Kernels(triton=True, moe_experts=True), Timer(True, 20)
    dtype = torch.bfloat16
    t0 = time.time()

    def log(text):
        print(f"[{time.time() - t0:6.1f} s] {text}", flush=True)

    res = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)",
           "date": datetime.date.today().isoformat(), "torch": torch.__version__, "command": " ".join(sys.argv)}
    shipped = step_plan.STEP_PLAN
    out = Path(args.out)
    sections = (("gemv", lambda: bench_gemv(cfg, rows_list, device, dtype, timer, kernels, log)),
                ("rotary", lambda: bench_rotary(cfg, device, dtype, timer, kernels, log)),
                ("router", lambda: bench_router(cfg, device, dtype, timer, kernels, log)),
                ("moe_down", lambda: bench_moe_down(cfg, [r for r in rows_list if moe_fp8.decode_plan().path(r) == "gemv"],
                                                    device, timer, kernels, log)))
    for name, run in sections:  # the plans rewritten after each section: a run cut off keeps what it measured
        with torch.no_grad():
            res[name] = run()
        step_plan.STEP_PLAN = shipped
        save(res, rows_list, out)
    print(markdown(res))


def save(res: dict, rows_list, out: Path) -> None:
    """The plans picked from the sections measured so far (the shipped choices for the others) and the tables."""
    default = StepPlan()
    launch = dict(rotary_heads=int(_pick_min(res["rotary"])) if res.get("rotary") else default.rotary_heads)
    if res.get("router"):
        splits, block_e, warps = (int(v) for v in _pick_min(res["router"]).replace("x", " ").replace("w", "").split())
        launch.update(router_splits=splits, router_block_e=block_e, select_warps=warps)
    gemv = pick_gemv(res["gemv"], rows_list) if res.get("gemv") else ()
    plans = {"step_plan": StepPlan(gemv=gemv, **launch), "step_plan_gemv": StepPlan(gemv=gemv),
             "step_plan_launch": StepPlan(**launch)}
    res["plan"] = step_plan.to_json(plans["step_plan"])
    out.mkdir(parents=True, exist_ok=True)
    for name, plan in plans.items():
        (out / f"{name}.json").write_text(json.dumps(step_plan.to_json(plan), indent=1))
    if res.get("moe_down"):
        res["fp8_plan"] = pick_fp8_plan(res["moe_down"])
        (out / "fp8_plan.json").write_text(json.dumps(res["fp8_plan"], indent=1))
    (out / "decode_step_bench.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "decode_step_bench.md").write_text(markdown(res))


if __name__ == "__main__":
    main()
