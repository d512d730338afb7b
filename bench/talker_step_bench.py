"""Where a talker step's time goes: the graphed step and its parts, per batch, on one GPU.

The full-size Ming talker (dummy bf16 weights, the Triton kernels) on one device: for each batch, the median replay
time of one CUDA graph of the whole step (`engine/talker_step.py`: LM decode + CFM with CFG + aggregator + stop
head), and of graphs of its parts -- the LM decode, the CFM sampler, one DiT call (the sampler makes `steps` of
them), the aggregator. `--profile B` also writes the GPU kernels of one replay of the batch-B step, summed by name
(torch.profiler). On GPUs only.

    python3 -m bench.talker_step_bench --device cuda:0 --batches 4,8,12,16,24,32 --profile 12 --out OUT
    python3 -m bench.talker_step_bench --variants base,compile,compile_ref --batches 12 --out OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from realtime_ming.engine.models import _build
from realtime_ming.engine.talker_step import talker_step
from realtime_ming.model.cfm import CFMParams, sway_time_grid
from realtime_ming.model.kernels import REFERENCE, TRITON
from realtime_ming.model.presets import preset_config
from realtime_ming.model.qwen2 import KVCache
from realtime_ming.model.talker import Talker

from .kernel_bench import graphed_us
from .report import agg_pyplot, save_figure


def _inputs(talker: Talker, batch: int, kv_len: int, device: torch.device, dtype: torch.dtype) -> dict:
    cfg, hid, lat = talker.cfg, talker.hidden_size, talker.latent_dim
    g = torch.Generator(device=device).manual_seed(batch)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype)

    return {"next_embed": rnd(batch, 1, hid), "pos": torch.full((batch, 1), kv_len, device=device),
            "fresh": torch.zeros(batch, dtype=torch.bool, device=device), "h": rnd(batch, 1, hid),
            "his": rnd(batch, cfg.history_patch_size, lat), "y0": rnd(batch, cfg.patch_size, lat),
            "sde_rnd": rnd(cfg.steps, batch, cfg.patch_size, lat)}


def parts(talker: Talker, cache: KVCache, t_grid: torch.Tensor, sde_args: torch.Tensor, x: dict) -> dict:
    """name -> a no-argument callable running that part of the step on `x`'s batch."""
    batch, model = x["h"].shape[0], talker.cfm.model
    rows = cache.rows(0, batch)
    ctx = model.cfg_context(x["h"], x["his"], t_grid[:-1])
    lat = x["y0"]
    return {
        "step": lambda: talker_step(talker, cache, t_grid, sde_args, x["next_embed"], x["pos"], x["fresh"], x["h"],
                                    x["his"], x["y0"], x["sde_rnd"]),
        "lm_decode": lambda: talker.decode_lm(x["next_embed"], x["pos"], rows),
        "cfm_sample": lambda: talker.cfm.sample(x["h"], x["his"], x["y0"], t_grid, sde_args, x["sde_rnd"]),
        "dit_call": lambda: model.forward_with_cfg(lat, 0, ctx),
        "aggregator": lambda: talker.aggregator(lat),
    }


def profile_step(fn, out: Path, tag: str) -> list[dict]:
    """The kernels of one replay of `fn` graphed, summed by name, longest first (also written as JSON)."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        r = rows.setdefault(ev.name, {"kernel": ev.name, "calls": 0, "us": 0.0})
        r["calls"] += 1
        r["us"] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    table = sorted(rows.values(), key=lambda r: -r["us"])
    (out / f"kernels_{tag}.json").write_text(json.dumps(table, indent=1))
    return table


VARIANTS = ("base", "compile", "compile_ref")


def build(variant: str, preset: str, device: torch.device, dtype: torch.dtype) -> Talker:
    """The talker of a variant: `base` as served (Triton kernels); `compile` / `compile_ref` with the DiT's block
    stack and the aggregator through `torch.compile` (over the Triton kernels / the reference ops)."""
    full = preset_config(preset)
    kernels = REFERENCE if variant == "compile_ref" else TRITON
    talker = _build(Talker, full.talker, device=device, what="talker", seed=0, dtype=dtype, kernels=kernels)
    if variant != "base":
        talker.cfm.model._velocity = torch.compile(talker.cfm.model._velocity, dynamic=False)
        talker.aggregator.forward = torch.compile(talker.aggregator.forward, dynamic=False)
    return talker


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--preset", default="ming-flash-omni-2.0")
    ap.add_argument("--batches", default="4,8,12,16,24,32")
    ap.add_argument("--kv-len", type=int, default=200, help="talker-LM positions already in each row's cache")
    ap.add_argument("--variants", default="base", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--profile", type=int, default=None, help="also list the kernels of the batch-B step")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device, dtype = torch.device(args.device), torch.bfloat16
    torch.cuda.set_device(device)
    full = preset_config(args.preset)
    batches = [int(b) for b in args.batches.split(",")]
    results = []
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
        try:
            results += run_variant(variant, build(variant, args.preset, device, dtype), full, batches, args, device,
                                   dtype)
        except Exception as exc:  # noqa: BLE001 -- a variant that fails is reported, the others still run
            print(f"variant {variant} failed: {type(exc).__name__}: {exc}", flush=True)
        torch.cuda.empty_cache()
    (args.out / "talker_step_bench.json").write_text(json.dumps({"device": torch.cuda.get_device_name(device),
                                                                 "args": vars(args) | {"out": str(args.out)},
                                                                 "rows": results}, indent=1))
    plot(results, args.out / "talker_step_bench.png")


def run_variant(variant: str, talker: Talker, full, batches: list[int], args, device, dtype) -> list[dict]:
    cache = KVCache.allocate(full.talker.llm, max(batches), args.kv_len + 64, device, dtype)
    cache.slot_pos[:, :args.kv_len] = torch.arange(args.kv_len, device=device)
    t_grid = sway_time_grid(talker.cfg.steps, dtype, device)
    sde_args = CFMParams().tensor(device, dtype)
    rows = []
    with torch.no_grad():
        for b in batches:
            x = _inputs(talker, b, args.kv_len, device, dtype)
            row = {"variant": variant, "batch": b}
            for name, fn in parts(talker, cache, t_grid, sde_args, x).items():
                row[name] = graphed_us(fn, calls=1, replays=20)
            row["dit_x_steps"] = row["dit_call"] * talker.cfg.steps
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.profile:
            x = _inputs(talker, args.profile, args.kv_len, device, dtype)
            table = profile_step(parts(talker, cache, t_grid, sde_args, x)["step"], args.out,
                                 f"{variant}_b{args.profile}")
            total = sum(r["us"] for r in table)
            print(f"{variant} batch {args.profile}: {sum(r['calls'] for r in table)} kernels, {total:.0f} us of "
                  "kernel time", flush=True)
            for r in table[:25]:
                print(f"{r['us']:9.1f} us {r['calls']:5d}x  {r['kernel'][:110]}", flush=True)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        xs = [r["batch"] for r in mine]
        for key in ("step", "cfm_sample", "lm_decode", "aggregator"):
            ax.plot(xs, [r[key] / 1000 for r in mine], marker="o", label=f"{variant}: {key}")
    ax.set_xlabel("rows (streams) in the step")
    ax.set_ylabel("ms per graphed call (median)")
    ax.set_title("talker step and its parts, one GPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
