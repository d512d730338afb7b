"""Where one graphed decode step's GPU time goes: every kernel of `steps` replays under torch.profiler (CUPTI
records the kernels inside CUDA graph replays), grouped by what they do.

    rows = kernel_profile(lambda: graph.step(...), steps=20)

Returns, per step: the wall time, the GPU busy time (union of kernel intervals) and so the idle gaps between
kernels (launch latency, host), each kernel's calls and µs, and the same per category (attention, norms, router,
experts, cuBLAS GEMMs, ...). `markdown(profile)` prints it. Used by tp_bench.py's `profile` stage.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

import torch

__all__ = ["CATEGORIES", "categorize", "kernel_profile", "markdown", "summarize_trace"]

# (category, kernel-name pattern), first match wins: this repository's Triton kernels by name, then library kernels
CATEGORIES = (
    ("moe gemv (fp8)", r"_decode_gate_up_kernel|_decode_down_kernel"),
    ("moe gemv (bf16)", r"_moe_gate_up_kernel|_moe_down_kernel"),
    ("moe grouped", r"_gate_up_kernel|_down_kernel"),
    ("a8 quantize", r"_quantize_rows_kernel"),
    ("router", r"_router_"),
    ("dense gemv (triton)", r"_gemv_kernel"),
    ("attention", r"_attn_|attention|flash|fmha"),
    ("rotary + kv write", r"_head_rotary|rotary"),
    ("rms norm", r"_rms_norm"),
    ("swiglu", r"silu|swiglu"),
    ("cublas gemm", r"gemm|gemv|cutlass|nvjet|sm90_xmma|cublas|splitK"),
    ("sort / scan (align_pairs)", r"sort|scan|cumsum|searchsorted|scatter|histogram|radix"),
    ("copy / fill", r"copy|fill|memset|memcpy|Memcpy|Memset"),
    ("elementwise / reduce", r"elementwise|reduce|vectorized|index|gather|argmax|unrolled"),
)


def categorize(name: str) -> str:
    return next((cat for cat, pattern in CATEGORIES if re.search(pattern, name)), "other")


def summarize_trace(events: list[dict], steps: int) -> dict:
    """Chrome-trace events (torch.profiler's export) -> per-step kernel table and busy time (µs)."""
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    per_name: dict[str, list[float]] = {}
    for e in kernels:
        per_name.setdefault(e["name"], []).append(float(e.get("dur", 0.0)))
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in kernels)
    busy, end = 0.0, None
    for start, stop in spans:
        if end is None or start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    rows = sorted(({"kernel": name, "category": categorize(name), "calls_per_step": len(d) / steps,
                    "us_per_step": sum(d) / steps, "us_per_call": sum(d) / len(d)} for name, d in per_name.items()),
                  key=lambda r: -r["us_per_step"])
    cats: dict[str, dict] = {}
    for r in rows:
        c = cats.setdefault(r["category"], {"category": r["category"], "calls_per_step": 0.0, "us_per_step": 0.0})
        c["calls_per_step"] += r["calls_per_step"]
        c["us_per_step"] += r["us_per_step"]
    return {"kernels": rows, "categories": sorted(cats.values(), key=lambda c: -c["us_per_step"]),
            "launches_per_step": sum(r["calls_per_step"] for r in rows),
            "kernel_us_per_step": sum(r["us_per_step"] for r in rows), "busy_us_per_step": busy / steps}


def kernel_profile(run, steps: int = 20, warmup: int = 3) -> dict:
    """Profile `steps` calls of `run` (a graph replay: one decode step) on the current CUDA device (on a machine
    without CUDA: the CPU ops only, no kernels: a dry run of the plumbing)."""
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        run()
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        run()
    sync()
    wall = (time.perf_counter() - t) * 1e6 / steps
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            run()
        sync()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    out = summarize_trace(events, steps)
    out["wall_us_per_step"] = wall
    out["idle_us_per_step"] = max(0.0, wall - out["busy_us_per_step"])
    return out


def markdown(profile: dict, top: int = 15) -> list[str]:
    """Lines: the step's wall / busy / idle time, the categories, the `top` kernels."""
    f = lambda v: f"{v:.1f}"  # noqa: E731
    lines = [f"wall {f(profile.get('wall_us_per_step', 0))} us a step, GPU busy {f(profile['busy_us_per_step'])} us, "
             f"idle between kernels {f(profile.get('idle_us_per_step', 0))} us, "
             f"{profile['launches_per_step']:.0f} kernels a step", "",
             "| category | kernels a step | us a step |", "|---|---|---|"]
    lines += [f"| {c['category']} | {c['calls_per_step']:.0f} | {f(c['us_per_step'])} |" for c in profile["categories"]]
    lines += ["", "| kernel | category | calls a step | us a call | us a step |", "|---|---|---|---|---|"]
    lines += [f"| `{r['kernel'][:60]}` | {r['category']} | {r['calls_per_step']:.0f} | {f(r['us_per_call'])} | "
              f"{f(r['us_per_step'])} |" for r in profile["kernels"][:top]]
    return lines
