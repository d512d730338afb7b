"""FP8 expert paths for decode batches, per row count, at the real shapes on one GPU: the measurements the decode
plan (model/kernels/moe_fp8.py `DECODE_PLAN`) is read from, a sweep of the GEMVs' tiles, and the plan they pick.

    python -m bench.fp8_decode_bench --out DIR [--tokens 1,2,4,8,16,64] [--tune] [--tune-grouped] [--tp 1]
    python -m bench.fp8_decode_bench --out DIR --dry-run     # CPU, Triton's interpreter, tiny shapes: plumbing only

One MoE layer (one rank of TP=--tp), dummy weights, routed by the real selection; per row count N the routed +
shared experts (what a decode step's MoE costs), µs graphed and relative L2 error against fp32:

* `gemv`: the FP8 GEMVs (moe_fp8.moe_decode, shared expert fused) with the shipped tiles; `gemv tuned`: with the
  sweep's best tiles (--tune: gate|up tiles first, then down's, at every N <= 8);
* `a8`: moe_fp8.fused_experts on the FP8 tensor cores + the shared expert (cuBLAS, as SparseMoeBlock), the
  activations quantised by PyTorch's ops (`a8 torch-q`) or in one launch each (`a8`, the shipped plan), and with
  narrower column tiles (`a8 bn=32`, `a8 bn=16`: more programs at few rows); `a8 tuned`: the best of a sweep of
  its tiles (--tune-grouped, at every N above 8: column tile and K chunk, then warps and pipeline stages);
  `w8a16`: weights widened to bf16;
* `bf16 gemv`, `bf16 grouped`: the model-dtype kernels, for reference.

Writes DIR/fp8_decode_bench.{json,md} and DIR/fp8_plan.json: per decode row count the faster of the GEMVs and the
a8 path, the GEMVs' tiles, the a8 column tile (`python bench/tp_bench.py ... --fp8-plan DIR/fp8_plan.json`).
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
from fp8_kernel_bench import Experts  # noqa: E402
from kernel_bench import graphed_us  # noqa: E402

from realtime_ming.model import moe  # noqa: E402
from realtime_ming.model.kernels import Kernels  # noqa: E402
from realtime_ming.model.kernels import moe_decode as md  # noqa: E402
from realtime_ming.model.kernels import moe_fp8  # noqa: E402
from realtime_ming.model.kernels.moe_experts import fused_experts  # noqa: E402
from realtime_ming.model.kernels.swiglu import silu_mul  # noqa: E402

# the sweep: gate|up (BLOCK_N rows, BLOCK_K, warps, pipeline stages), then down (BLOCK_D rows, BLOCK_K, warps,
# stages). Compiled for sm_90 offline (ptxas -v): gate|up (4, 512, 2) holds 128 registers a thread, 117 with 3
# stages, (4, 512, 4) 76; down (4, 512, 2) 151, 128 with 3 stages, (4, 256, 2) 90: few programs an SM, so few
# bytes in flight; the stages (async copies ahead) and narrower tiles are what the sweep tries.
GU_TILES = [(n, k, w, st) for n, k, w in ((2, 256, 1), (2, 256, 2), (2, 512, 2), (4, 256, 2), (4, 512, 2), (4, 512, 4),
                                          (8, 256, 4), (8, 512, 4), (4, 1024, 4)) for st in (1, 3)] + \
    [(4, 512, 2, 2), (4, 512, 2, 4)]
# the a8 path's sweep (fused_experts' block_n, block_k; then num_warps, num_stages on the best of those)
GROUPED_NK = [(bn, bk) for bn in (32, 64, 128) for bk in (64, 128, 256)]
GROUPED_WS = [(w, st) for w in (4, 8) for st in (2, 3, 4, 5)]
DN_TILES = [(d, k, w, st) for d, k, w in ((2, 256, 1), (2, 512, 1), (4, 256, 2), (4, 512, 2), (8, 256, 4), (4, 1024, 4),
                                          (2, 1024, 1)) for st in (1, 3)] + [(4, 512, 2, 2), (4, 256, 2, 4)]
TUNE_MAX_ROWS = 8  # the GEMVs are swept up to here (at 16 rows the a8 path wins by 1.5x)


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


class Timer:
    """µs per call: graphed on CUDA (kernel_bench.graphed_us), one eager call on CPU (a dry run: not a timing)."""

    def __init__(self, cuda: bool, calls: int):
        self.cuda, self.calls = cuda, calls

    def __call__(self, fn, calls: int | None = None) -> float:
        if self.cuda:
            return graphed_us(fn, calls=calls or self.calls, replays=5)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6


class Layer:
    """One decode batch of N rows on `Experts`: the paths as closures, and the fp32 truth (routed + shared)."""

    def __init__(self, ex: Experts, n: int, kernels: Kernels, seed: int):
        self.ex, self.n, self.kernels = ex, n, kernels
        g = torch.Generator(ex.device).manual_seed(seed)
        self.x = torch.randn(n, ex.d, device=ex.device, generator=g).to(ex.w_gu.dtype)
        self.ids, self.weights = ex.route(self.x)
        self.shared_gu = torch.cat([ex.sg, ex.su])
        with torch.no_grad():
            x32 = self.x.float()
            routed = moe.experts_grouped(x32, self.ids, self.weights, ex.w_gu.float(), ex.w_dn.float())
            self.truth = routed + self._shared(x32, self.shared_gu.float(), ex.sd.float())

    def _shared(self, x, gu, down):
        return F.linear(silu_mul(F.linear(x, gu), kernels=self.kernels), down)

    def gemv(self, tune: dict | None = None):
        ex = self.ex
        return lambda: moe_fp8.moe_decode(self.x, self.ids, self.weights, ex.q_gu, ex.q_dn, ex.sg, ex.su, ex.sd,
                                          ex.s_gu, ex.s_dn, kernels=self.kernels, tune=tune)

    def grouped(self, **kw):
        ex = self.ex

        def run():  # SparseMoeBlock's path: routed (fp32) to the model dtype, plus the shared expert
            routed = moe_fp8.fused_experts(self.x, self.ids, self.weights, ex.q_gu, ex.q_dn, ex.s_gu, ex.s_dn, **kw)
            return routed.to(self.x.dtype) + self._shared(self.x, self.shared_gu, ex.sd)
        return run

    def bf16_gemv(self):
        ex = self.ex
        return lambda: md.moe_decode(self.x, self.ids, self.weights, ex.w_gu, ex.w_dn, ex.sg, ex.su, ex.sd,
                                     kernels=self.kernels)

    def bf16_grouped(self):
        ex = self.ex
        return lambda: (fused_experts(self.x, self.ids, self.weights, ex.w_gu, ex.w_dn).to(self.x.dtype)
                        + self._shared(self.x, self.shared_gu, ex.sd))


def _tiles(gu, dn) -> dict:
    return {"gu_n": gu[0], "gu_k": gu[1], "gu_warps": gu[2], "gu_stages": gu[3], "dn_d": dn[0], "dn_k": dn[1],
            "dn_warps": dn[2], "dn_stages": dn[3]}


def tune_gemv(layer: Layer, timer: Timer, log) -> tuple[dict, float]:
    """Coordinate sweep of the GEMVs' tiles at this row count: gate|up with down fixed, then down -> (tiles, µs)."""
    base = moe_fp8.decode_plan().tiles(layer.n)
    best_gu = (base["gu_n"], base["gu_k"], base["gu_warps"], base.get("gu_stages", 1))
    best_dn = (base["dn_d"], base["dn_k"], base["dn_warps"], base.get("dn_stages", 1))
    best_us = timer(layer.gemv(_tiles(best_gu, best_dn)), calls=20)
    for which, cands in (("gu", GU_TILES), ("dn", DN_TILES)):
        for cand in cands:
            gu, dn = (cand, best_dn) if which == "gu" else (best_gu, cand)
            try:
                us = timer(layer.gemv(_tiles(gu, dn)), calls=20)
            except Exception as exc:  # noqa: BLE001 - a tile that does not compile is skipped
                log(f"  N={layer.n} tiles {_tiles(gu, dn)}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            if us < best_us:
                best_us, best_gu, best_dn = us, gu, dn
    return _tiles(best_gu, best_dn), best_us


def tune_grouped(layer: Layer, timer: Timer, log) -> tuple[dict, float]:
    """Coordinate sweep of the a8 path's tiles at this row count: (block_n, block_k), then (warps, stages)."""
    best, best_us = {}, timer(layer.grouped(fused_quantize=True), calls=20)
    for cands in ([dict(block_n=bn, block_k=bk) for bn, bk in GROUPED_NK],
                  [dict(num_warps=w, num_stages=st) for w, st in GROUPED_WS]):
        base = dict(best)
        for cand in cands:
            tiles = {**base, **cand}
            try:
                us = timer(layer.grouped(fused_quantize=True, **tiles), calls=20)
            except Exception as exc:  # noqa: BLE001 - a tile that does not compile (shared memory) is skipped
                log(f"  N={layer.n} a8 tiles {tiles}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            if us < best_us:
                best, best_us = tiles, us
    return best, best_us


def measure(ex: Experts, n: int, args, kernels: Kernels, timer: Timer, log) -> dict:
    layer = Layer(ex, n, kernels, seed=n)
    paths = {}
    decode = n <= md.MAX_DECODE_TOKENS
    if decode:
        paths["gemv"] = layer.gemv()
    paths["a8 torch-q"] = layer.grouped(fused_quantize=False)
    paths["a8"] = layer.grouped(fused_quantize=True)
    if decode:
        for bn in (32, 16):
            paths[f"a8 bn={bn}"] = layer.grouped(fused_quantize=True, block_n=bn)
    paths["w8a16"] = layer.grouped(a8=False)
    if decode:
        paths["bf16 gemv"] = layer.bf16_gemv()
    paths["bf16 grouped"] = layer.bf16_grouped()
    row: dict = {"experts_read": int(layer.ids.unique().numel())}
    if args.tune and decode and n <= TUNE_MAX_ROWS:
        tiles, _ = tune_gemv(layer, timer, log)
        row["gemv_tuned_tiles"] = tiles
        paths["gemv tuned"] = layer.gemv(tiles)
    if args.tune_grouped and n > TUNE_MAX_ROWS:
        tiles, _ = tune_grouped(layer, timer, log)
        row["a8_tuned_tiles"] = tiles
        paths["a8 tuned"] = layer.grouped(fused_quantize=True, **tiles)
    for name, fn in paths.items():
        with torch.no_grad():
            err = _rel(fn().float(), layer.truth)
        row[name] = {"us": round(timer(fn), 2), "rel_err_vs_fp32": round(err, 5)}
    return row


def pick_plan(rows: dict) -> dict:
    """The plan the measurements pick: per decode row count the faster of the GEMVs (shipped or tuned tiles) and
    the a8 path (best column tile), the GEMVs' tiles per row count, the a8 tile of the largest grouped row count."""
    shipped = moe_fp8.decode_plan()
    paths, tiles, grouped, why = [], [], {}, {}
    for n in sorted(int(k) for k in rows):
        if n > md.MAX_DECODE_TOKENS:
            continue
        r = rows[n]
        gemv_name = min((k for k in ("gemv", "gemv tuned") if k in r), key=lambda k: r[k]["us"])
        a8_name = min((k for k in r if k.startswith("a8") and "torch" not in k and "tuned" not in k),
                      key=lambda k: r[k]["us"])
        path = "gemv" if r[gemv_name]["us"] <= r[a8_name]["us"] else "grouped"
        paths.append([n, path])
        tiles.append([n, r.get("gemv_tuned_tiles") if gemv_name == "gemv tuned" else shipped.tiles(n)])
        if path == "grouped":
            grouped = {"block_n": int(a8_name.split("=")[1])} if "=" in a8_name else {}
        why[n] = f"{gemv_name} {r[gemv_name]['us']} us vs {a8_name} {r[a8_name]['us']} us -> {path}"
    plan = {"paths": paths, "gemv_tiles": tiles, "fused_quantize": True, "grouped": grouped}
    fp8_variants.from_json(plan)  # a plan tp_bench will take
    return {"plan": plan, "why": why}


def markdown(res: dict) -> str:
    names = []
    for row in res["rows"].values():
        names += [k for k, v in row.items() if isinstance(v, dict) and "us" in v and k not in names]
    lines = ["| N | experts read | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for n, row in res["rows"].items():
        cells = [f"{row[k]['us']:.1f} ({row[k]['rel_err_vs_fp32']:.3f})" if k in row else "—" for k in names]
        lines.append(f"| {n} | {row['experts_read']} | " + " | ".join(cells) + " |")
    lines += ["", "µs per layer, graphed (relative L2 error against fp32 in brackets); routed + shared experts.", "",
              "Plan picked: `" + json.dumps(res["picked"]["plan"]) + "`", ""]
    lines += [f"- N={n}: {w}" for n, w in res["picked"]["why"].items()]
    tuned = {n: r["gemv_tuned_tiles"] for n, r in res["rows"].items() if "gemv_tuned_tiles" in r}
    if tuned:
        lines += ["", "GEMV tiles the sweep picked: `" + json.dumps(tuned) + "`"]
    grouped = {n: r["a8_tuned_tiles"] for n, r in res["rows"].items() if "a8_tuned_tiles" in r}
    if grouped:
        lines += ["", "a8 tiles the sweep picked (fused_experts overrides): `" + json.dumps(grouped) + "`"]
    plan = res["picked"]["plan"]
    lines += ["", "As model/kernels/moe_fp8.py's table (`_GEMV_TILES`, `DECODE_PLAN`):", "", "```python"]
    lines += ["_GEMV_TILES = ("] + [f"    ({n}, {t})," for n, t in plan["gemv_tiles"]] + [")"]
    lines += [f"DECODE_PLAN = DecodePlan(paths={tuple(tuple(p) for p in plan['paths'])}, "
              f"grouped={plan['grouped']})", "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--tokens", default="1,2,4,8,16,64")
    ap.add_argument("--tune", action="store_true", help="sweep the GEMVs' tiles at every N <= 8")
    ap.add_argument("--tune-grouped", action="store_true", help="sweep the a8 path's tiles at every N above 8")
    ap.add_argument("--dry-run", action="store_true", help="CPU, Triton's interpreter, tiny shapes (plumbing only)")
    args = ap.parse_args(argv)
    tokens = [int(v) for v in args.tokens.split(",")]
    torch.manual_seed(0)
    if args.dry_run:
        from realtime_ming.model.presets import tiny_config
        from realtime_ming.model.tiny_tokenizer import (
            TINY_VOCAB_SIZE,
            tiny_talker_special_ids,
            tiny_thinker_special_ids,
        )

        cfg = tiny_config(tiny_thinker_special_ids(), tiny_talker_special_ids(), TINY_VOCAB_SIZE).thinker
        ex = Experts(args.tp, cfg=cfg, device="cpu", dtype=torch.float32)
        kernels, timer = Kernels(triton=True, cpu_interpreter=True), Timer(False, 1)
        global GU_TILES, DN_TILES  # noqa: PLW0603 - one candidate each: the sweep's plumbing, not its breadth
        global GROUPED_NK, GROUPED_WS  # noqa: PLW0603
        GU_TILES, DN_TILES = [(4, 64, 1, 3)], [(4, 64, 1, 3)]
        GROUPED_NK, GROUPED_WS = [(32, 64)], [(4, 2)]
    else:
        ex = Experts(args.tp)
        kernels, timer = Kernels(triton=True, moe_experts=True), Timer(True, 50)
    res = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (dry run)",
           "date": datetime.date.today().isoformat(), "torch": torch.__version__, "command": " ".join(sys.argv),
           "tp": args.tp, "shipped_plan": fp8_variants.to_json(moe_fp8.decode_plan()), "rows": {}}
    t0 = time.time()

    def log(text):
        print(f"[{time.time() - t0:6.1f} s] {text}", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for n in tokens:  # the files rewritten after each row count: a run cut off keeps what it measured
        res["rows"][n] = measure(ex, n, args, kernels, timer, log)
        log(f"N={n}: {json.dumps(res['rows'][n])}")
        res["picked"] = pick_plan(res["rows"])
        (out / "fp8_decode_bench.json").write_text(json.dumps(res, indent=1))
        (out / "fp8_plan.json").write_text(json.dumps(res["picked"]["plan"], indent=1))
        (out / "fp8_decode_bench.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
