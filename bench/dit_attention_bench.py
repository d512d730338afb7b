"""The talker's DiT attention kernel (`model/kernels/dit_attention.py`) per launch configuration (one GPU).

    python bench/dit_attention_bench.py --out DIR [--rows 2,4,6,8,12,16,24,32] [--warps 2,4,8]

At the full-size DiT's shapes (heads and head dim from the preset) and the talker's sequences (the DiT's
1 + history + patch tokens, all queries or only the patch's, and the aggregator's 1 + patch), each
(query rows per program, warps) is timed 50 calls in one CUDA graph (`kernel_bench.graphed_us`, median of
10 replays), its output checked against the shipped configuration's, and the fastest per shape reported
beside the shipped choice (`launch_config`). Writes dit_attention.json and a plot.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kernel_bench import graphed_us  # noqa: E402
from realtime_ming.model.dit import InterleavedRotary  # noqa: E402
from realtime_ming.model.kernels import TRITON  # noqa: E402
from realtime_ming.model.kernels import dit_attention as da  # noqa: E402
from realtime_ming.model.presets import preset_config  # noqa: E402


def shapes(cfg) -> list[tuple[str, int, int, int]]:
    """(name, tokens, queries, heads) of the talker's attention calls: the DiT's with CFG, its last block (the patch
    queries only), the aggregator's."""
    dit, agg = cfg.flowmodel, cfg.aggregator
    t = 1 + cfg.history_patch_size + cfg.patch_size
    return [("dit", t, t, dit.num_heads), ("dit_last", t, cfg.patch_size, dit.num_heads),
            ("aggregator", 1 + cfg.patch_size, 1 + cfg.patch_size, agg.num_heads)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="ming-flash-omni-2.0")
    ap.add_argument("--rows", default="2,4,6,8,12,16,24,32", help="talker rows (the DiT runs twice as many: CFG)")
    ap.add_argument("--warps", default="2,4,8")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = preset_config(args.preset).talker
    width = {"dit": cfg.flowmodel.hidden_size, "aggregator": cfg.aggregator.hidden_size}
    shipped = da.launch_config
    results = []
    for (name, t, nq, heads), rows in itertools.product(shapes(cfg), [int(r) for r in args.rows.split(",")]):
        b = rows * 2 if name.startswith("dit") else rows
        d = width["aggregator" if name == "aggregator" else "dit"]
        qkv = torch.randn(b, t, 3 * d, device="cuda", dtype=torch.bfloat16)
        cos, sin = InterleavedRotary(d // heads).cuda()(t)
        want = da.rotary_attention(qkv, heads, cos, sin, kernels=TRITON, queries=nq)
        base = shipped(nq)
        row = {"shape": name, "rows": rows, "dit_rows": b, "tokens": t, "queries": nq, "shipped": list(base),
               "us": {}}
        blocks = [m for m in (16, 32, 64, 128) if m <= max(16, 1 << (nq - 1).bit_length())]
        for block_m, warps in itertools.product(blocks, [int(w) for w in args.warps.split(",")]):
            da.launch_config = lambda *_a, _c=(block_m, warps): _c
            try:
                got = da.rotary_attention(qkv, heads, cos, sin, kernels=TRITON, queries=nq)
                err = (got.float() - want.float()).abs().max().item()
                us = graphed_us(lambda: da.rotary_attention(qkv, heads, cos, sin, kernels=TRITON, queries=nq))
            finally:
                da.launch_config = shipped
            row["us"][f"{block_m}x{warps}"] = {"us": round(us, 2), "max_abs_diff": err}
        best = min(row["us"], key=lambda k: row["us"][k]["us"])
        row["best"], row["shipped_us"] = best, row["us"][f"{base[0]}x{base[1]}"]["us"]
        print(f"{name:10s} rows {rows:3d} (x{b // rows}) T={t} Q={nq}: shipped {base} {row['shipped_us']:.2f} us, "
              f"best {best} {row['us'][best]['us']:.2f} us  " + " ".join(f"{k}:{v['us']:.1f}" for k, v in row["us"].items()),
              flush=True)
        results.append(row)
    device = torch.cuda.get_device_name()
    (out / "dit_attention.json").write_text(json.dumps({"device": device, "torch": torch.__version__,
                                                         "argv": sys.argv, "results": results}, indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in dict.fromkeys(r["shape"] for r in results):
        rs = [r for r in results if r["shape"] == name]
        ax.plot([r["rows"] for r in rs], [r["shipped_us"] for r in rs], "o-", label=f"{name} shipped")
        ax.plot([r["rows"] for r in rs], [r["us"][r["best"]]["us"] for r in rs], "x--", label=f"{name} best")
    ax.set(xlabel="talker rows", ylabel="µs per call", title=f"DiT attention kernel, {device}")
    ax.legend()
    fig.savefig(out / "dit_attention.png", dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
