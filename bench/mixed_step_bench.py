"""The mixed step against two forwards, at the full thinker shapes, by history length (one GPU, one shadow TP rank).

    python -m bench.mixed_step_bench --out DIR [--tp 2] [--rows 24] [--chunks 64,448] [--histories 0,1024,3072]
    python -m bench.mixed_step_bench --replot DIR/mixed_step_bench.json     # the plot again, from the JSON

One step that decodes `rows` rows (each on its own slot, positions history + 7·i) and prefills a chunk of C tokens
continuing a slot that already holds `history` tokens, timed two ways, each CUDA-graphed as the engine runs it:
  two forwards  the decode graph (`ThinkerDecoder`), then the one-row prefill graph (`ThinkerPrefiller`) and the
                chunk's last-token logits;
  mixed         one `ThinkerMixer` graph over rows + C one-token rows.
The mixed step reads the MoE experts once instead of twice, but its chunk tokens attend with the one-token decode
kernel (each reads its slot up to its position), which costs more than the prefill kernel as the history grows:
this measures where the one outweighs the other. Dummy bf16 weights; the thinker is rank 0 of TP=`tp` alone on the
GPU with collectives skipped (`TPGroup(shadow=True)`: one rank's compute). Host wall time per step (inputs uploaded,
graphs replayed, synchronised), median of `--iters`. Writes mixed_step_bench.json / .md / .png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from realtime_ming.engine.graphs import upload
from realtime_ming.engine.thinker_decode import ThinkerDecoder
from realtime_ming.engine.thinker_mixed import ThinkerMixer
from realtime_ming.engine.thinker_prefill import ThinkerPrefiller
from realtime_ming.model.kernels import TRITON
from realtime_ming.model.layers import TPGroup
from realtime_ming.model.loader import init_dummy
from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.presets import preset_config
from realtime_ming.model.thinker import Thinker, ThinkerKVCache

from realtime_ming.bench.report import agg_pyplot, save_figure

__all__ = ["main"]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _build(args, device, dtype):
    folder = Path(args.preset)  # a checkpoint folder's config (CPU smoke runs: the fixture), or a preset's
    cfg = (load_checkpoint_config(folder) if folder.is_dir() else preset_config(args.preset)).thinker
    tp = TPGroup(0, args.tp, shadow=args.tp > 1)
    with torch.device("meta"):
        thinker = Thinker(cfg, tp, kernels=TRITON)
    init_dummy(thinker, seed=0, device=device, dtype=dtype)
    cache = ThinkerKVCache.allocate(cfg, args.rows + 1, args.capacity, device=device, dtype=dtype, tp=tp)
    return thinker.eval(), cache


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, iters: int, device: torch.device) -> float:
    for _ in range(3):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run(args) -> dict:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    thinker, cache = _build(args, device, dtype)
    rows, hidden = args.rows, thinker.cfg.hidden_size
    decoder = ThinkerDecoder(thinker, cache, (rows,), (cache.capacity,), device=device)
    prefiller = ThinkerPrefiller(thinker, cache, args.chunks, dtype=dtype, device=device, rows=(1,),
                                 tokens=max(args.chunks))
    mixer = ThinkerMixer(thinker, cache, [rows + c for c in args.chunks], picks=rows + 1, dtype=dtype, device=device)
    t0 = time.monotonic()
    for i, step in enumerate((decoder, prefiller, mixer)):
        print(f"[capture {i + 1}/3] {type(step).__name__} ...", flush=True)
        step.capture()
    print(f"captured in {time.monotonic() - t0:.1f} s", flush=True)
    results = []
    total = len(args.histories) * len(args.chunks)
    for history in args.histories:
        for c in args.chunks:
            d = rows
            positions = [history + 7 * i for i in range(d)]
            slots = list(range(1, d + 1))
            chunk_pos = list(range(history, history + c))
            embeds = torch.randn(1, c, hidden, device=device, dtype=dtype)

            def apart():
                decoder.step([5] * d, positions, [0] * d, slots)
                cpos = upload([chunk_pos], torch.int64, device)
                mask = torch.zeros(1, c, dtype=torch.bool, device=device)
                hidden_states = prefiller.step(embeds, cpos[None].expand(3, 1, c), cpos, upload([0], torch.int64, device),
                                               mask, mask)
                thinker.logits(hidden_states[:, -1])

            def mixed():  # the rows of MIXED_FIELDS: tok, is_tok, pos, slot, rotary x3, image, audio
                head = [[5] * d + [0] * c, [1] * d + [0] * c, positions + chunk_pos, slots + [0] * c]
                ints = upload(head + [positions + chunk_pos] * 3 + [[0] * (d + c)] * 2, torch.int64, device)
                packed = torch.cat((torch.zeros(d, hidden, device=device, dtype=dtype), embeds[0]))
                needed = max(positions + chunk_pos) + 1
                mixer.step(needed, ints, packed, upload([d + c - 1, *range(d)], torch.int64, device))

            row = {"history": history, "chunk": c, "rows": d, "two_forwards_ms": _timed(apart, args.iters, device),
                   "mixed_ms": _timed(mixed, args.iters, device)}
            results.append(row)
            print(f"[{len(results)}/{total}] history {history:5d}, chunk {c:4d}: two forwards "
                  f"{row['two_forwards_ms']:.2f} ms, mixed {row['mixed_ms']:.2f} ms", flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {"device": name, "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.date.today().isoformat(), "preset": args.preset, "dtype": str(dtype).removeprefix("torch."), "tp_shadow": args.tp, "iters": args.iters,
            "results": results}


def markdown(report: dict) -> str:
    lines = [f"# Mixed step vs two forwards — {report['date']}", "",
             f"Device: {report['device']}, torch {report['torch']}; preset {report['preset']} (dummy {report['dtype']}), one "
             f"shadow rank of TP={report['tp_shadow']}; host wall per step, median of {report['iters']}.", "",
             "| history | chunk tokens | decode rows | two forwards ms | mixed ms | mixed / two |", "|---|---|---|---|---|---|"]
    for r in report["results"]:
        lines.append(f"| {r['history']} | {r['chunk']} | {r['rows']} | {r['two_forwards_ms']:.2f} | {r['mixed_ms']:.2f} "
                     f"| {r['mixed_ms'] / r['two_forwards_ms']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> Path | None:
    plt = agg_pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in sorted({r["chunk"] for r in report["results"]}):
        rs = [r for r in report["results"] if r["chunk"] == c]
        xs = [r["history"] for r in rs]
        ax.plot(xs, [r["two_forwards_ms"] for r in rs], "o--", label=f"two forwards, chunk {c}")
        ax.plot(xs, [r["mixed_ms"] for r in rs], "o-", label=f"mixed, chunk {c}")
    ax.set_xlabel("tokens already in the chunk's slot (and the decode rows')")
    ax.set_ylabel("ms per step (median)")
    ax.set_title(f"{report['results'][0]['rows']} decode rows + one chunk, {report['device']}")
    ax.legend()
    return save_figure(fig, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path)
    p.add_argument("--replot", type=Path, help="write the plot of an earlier run's JSON next to it")
    p.add_argument("--preset", default="ming-flash-omni-2.0", help="a preset, or a checkpoint folder (its config)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--rows", type=int, default=24)
    p.add_argument("--chunks", type=_ints, default=(64, 448))
    p.add_argument("--histories", type=_ints, default=(0, 1024, 3072))
    p.add_argument("--capacity", type=int, default=4096)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    if args.replot:
        print(plot(json.loads(args.replot.read_text()), args.replot.with_suffix(".png")))
        return
    if args.out is None:
        p.error("--out is required")
    if max(args.histories) + max(args.chunks) + 7 * args.rows > args.capacity:
        p.error("a history + chunk (or a decode row's position) exceeds --capacity")
    args.out.mkdir(parents=True, exist_ok=True)
    report = run(args)
    (args.out / "mixed_step_bench.json").write_text(json.dumps(report, indent=2))
    (args.out / "mixed_step_bench.md").write_text(markdown(report))
    plot(report, args.out / "mixed_step_bench.png")
    print(markdown(report))


if __name__ == "__main__":
    main()
