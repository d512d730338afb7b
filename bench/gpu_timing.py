"""Timing, memory-floor and report helpers of the GPU component benchmark (bench/gpu_bench.py).

CUDA-event latency per call (median of synchronised repeats, warm-up first), the two device
ceilings (device-to-device copy bandwidth, bf16 matmul rate) and a results writer that keeps the
JSON and the markdown table on disk after every stage, so a cut-off run still leaves its numbers.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

__all__ = ["Results", "cuda_ms", "measure_ceilings", "param_bytes"]


def cuda_ms(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> dict:
    """Latency of one call in ms: median / min / p90 over `reps` calls, each synchronised (CUDA events;
    a host clock when no GPU is present, for dry runs)."""
    for _ in range(warmup):
        fn()
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if not gpu:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return {"median_ms": statistics.median(times), "min_ms": times[0],
            "p90_ms": times[min(len(times) - 1, int(0.9 * len(times)))], "reps": reps}


def measure_ceilings(device: str = "cuda") -> dict:
    """Device-to-device copy bandwidth (bytes read + written) and a bf16 m³ matmul rate, on random data."""
    n, m = (1 << 30, 8192) if device == "cuda" else (1 << 24, 512)  # 1 GiB buffer on the GPU
    src = torch.randn(n // 2, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy = cuda_ms(partial(dst.copy_, src), reps=10)
    a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    mm = cuda_ms(partial(torch.matmul, a, b), reps=10)
    del src, dst, a, b
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"copy_GBps": 2 * n / copy["median_ms"] / 1e6, "bf16_matmul_TFLOPs": 2 * m ** 3 / mm["median_ms"] / 1e9}


def param_bytes(module: torch.nn.Module, skip: tuple[str, ...] = ()) -> int:
    """Bytes of the module's parameters and buffers, leaving out names containing any of `skip`."""
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    return sum(t.numel() * t.element_size() for name, t in tensors if not any(s in name for s in skip))


class Results:
    """Nested results dict written as JSON + markdown under `out` after every `save()`."""

    def __init__(self, out: Path, meta: dict):
        self.out = out
        self.out.mkdir(parents=True, exist_ok=True)
        self.data: dict = {"meta": meta, "stages": {}}
        self.tables: list[tuple[str, list[str], list[list]]] = []
        self.t0 = time.time()

    def stage(self, name: str, value) -> None:
        self.data["stages"][name] = value
        self.save()

    def table(self, title: str, header: list[str], rows: list[list]) -> None:
        self.tables.append((title, header, rows))
        self.save()

    def note(self, text: str) -> None:
        self.data.setdefault("notes", []).append(text)
        print(f"[note] {text}", flush=True)
        self.save()

    def save(self) -> None:
        self.data["meta"]["elapsed_s"] = round(time.time() - self.t0, 1)
        (self.out / "gpu_bench.json").write_text(json.dumps(self.data, indent=1, default=str))
        (self.out / "gpu_bench.md").write_text(self.markdown())

    def markdown(self) -> str:
        meta = self.data["meta"]
        lines = ["# GPU component benchmark (dummy weights, real Ming-flash-omni-2.0 shapes)", ""]
        lines += [f"- {k}: {v}" for k, v in meta.items()]
        for title, header, rows in self.tables:
            lines += ["", f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
        if self.data.get("notes"):
            lines += ["", "## Notes", ""] + [f"- {n}" for n in self.data["notes"]]
        return "\n".join(lines) + "\n"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return "—" if v is None else str(v)
