"""Reading where an engine's time goes: one round under torch.profiler with the engine thread's Python stack
sampled beside it (`profile_round`, `StackSampler`), and a chrome trace's GPU occupancy and CUDA runtime calls
(`trace_summary`). Used by bench/engine_bench.py --profile.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["StackSampler", "profile_round", "trace_summary"]


def profile_round(thread: threading.Thread, run: Callable[[], dict], label: str, out: Path) -> None:
    """`run()` (one closed-loop round -> its summary, with `turns_per_s` and `wall_s`) under torch.profiler (CPU +
    CUDA), `thread` (the engine's) stack-sampled: where the engine thread's time goes (CUDA runtime calls that
    block: synchronisations, copies from pageable memory, graph launches into a full queue) and which kernels fill
    the GPU. Writes out/profile.md (headed `label`) and out/trace.json.gz (chrome://tracing)."""
    import gzip

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    out.mkdir(parents=True, exist_ok=True)
    sampler = StackSampler(thread)
    with torch.profiler.profile(activities=activities) as prof, sampler:
        s = run()
    ka = prof.key_averages()
    lines = [f"# {label}, {s['turns_per_s']:.2f} turns/s (wall {s['wall_s']:.2f} s, under the profiler)", "",
             "## host: self CPU time", "", "```", ka.table(sort_by="self_cpu_time_total", row_limit=30), "```"]
    if torch.cuda.is_available():
        lines += ["", "## GPU: self CUDA time", "", "```", ka.table(sort_by="self_cuda_time_total", row_limit=30), "```"]
    trace = out / "trace.json"
    prof.export_chrome_trace(str(trace))
    lines += trace_summary(json.loads(trace.read_text())) + sampler.summary()
    (out / "profile.md").write_text("\n".join(lines) + "\n")
    with open(trace, "rb") as src, gzip.open(str(trace) + ".gz", "wb") as dst:
        dst.write(src.read())
    trace.unlink()
    print(f"wrote {out}/profile.md and trace.json.gz", flush=True)


class StackSampler:
    """Samples one thread's Python stack every `interval_s` (torch.profiler records no CPU ops on the engine
    thread): the share of samples each function is on the stack (cumulative) and at the top (self)."""

    def __init__(self, thread: threading.Thread, interval_s: float = 0.001):
        self.ident, self.interval = thread.ident, interval_s
        self.cumulative: dict = defaultdict(int)
        self.own: dict = defaultdict(int)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.ident)
            if frame is None:
                continue
            self.samples += 1
            names, top = set(), True
            while frame is not None:
                code = frame.f_code
                name = f"{Path(code.co_filename).name}:{code.co_name}"
                if top:
                    self.own[name] += 1
                    top = False
                names.add(name)
                frame = frame.f_back
            for name in names:
                self.cumulative[name] += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self, rows: int = 25) -> list[str]:
        if not self.samples:
            return []
        n = self.samples
        lines = ["", f"## engine thread, Python stack samples ({n}, every {self.interval * 1e3:.0f} ms)", "",
                 "| function | on the stack | at the top |", "|---|---|---|"]
        for name, c in sorted(self.cumulative.items(), key=lambda kv: -kv[1])[:rows]:
            lines.append(f"| {name} | {100 * c / n:.0f}% | {100 * self.own.get(name, 0) / n:.0f}% |")
        lines += ["", "| function (self) | at the top |", "|---|---|"]
        lines += [f"| {name} | {100 * c / n:.0f}% |" for name, c in sorted(self.own.items(), key=lambda kv: -kv[1])[:rows]]
        return lines


def trace_summary(trace: dict) -> list[str]:
    """From a chrome trace: how busy the GPU was (union of kernel time, and per stream) over the traced span,
    and the CUDA runtime calls (every host thread) with the most time — blocking ones show up there."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    kernels = sorted((e["ts"], e["ts"] + e["dur"], (e.get("pid"), e.get("tid")))
                     for e in events if e.get("cat") in ("kernel", "gpu_memcpy"))
    if not kernels:
        return []
    span = kernels[-1][1] - kernels[0][0]
    busy = _union(kernels)
    per_stream: dict = defaultdict(float)
    for a, b, key in kernels:
        per_stream[key] += b - a
    devices = sorted({key[0] for _, _, key in kernels}, key=str)
    runtime: dict = defaultdict(lambda: [0, 0.0, 0.0])
    for e in events:
        if e.get("cat") == "cuda_runtime":
            r = runtime[e["name"]]
            r[0] += 1
            r[1] += e["dur"]
            r[2] = max(r[2], e["dur"])
    lines = ["", f"## GPU occupancy over the traced {span / 1e3:.0f} ms: some kernel running {100 * busy / span:.0f}% "
             "of the time", "", "| device/stream | kernel ms | share of the span |", "|---|---|---|"]
    lines += [f"| {dev}/{tid} | {t / 1e3:.0f} | {100 * t / span:.0f}% |" for (dev, tid), t in sorted(per_stream.items(), key=lambda kv: -kv[1])]
    if len(devices) > 1:  # each GPU apart: a talker GPU idle half the time is host-bound, one busy throughout is not
        lines += ["", "| device (trace pid) | some kernel running | streams |", "|---|---|---|"]
        for dev in devices:
            mine = [k for k in kernels if k[2][0] == dev]
            lines.append(f"| {dev} | {100 * _union(mine) / span:.0f}% | {len({k[2] for k in mine})} |")
    lines += ["", "## CUDA runtime calls (all host threads)", "", "| call | count | total ms | max ms |", "|---|---|---|---|"]
    lines += [f"| {name} | {c} | {t / 1e3:.1f} | {m / 1e3:.2f} |"
              for name, (c, t, m) in sorted(runtime.items(), key=lambda kv: -kv[1][1])[:15]]
    return lines


def _union(intervals: list) -> float:
    """Total length covered by sorted (start, end, ...) intervals."""
    busy, end = 0.0, intervals[0][0] if intervals else 0.0
    for a, b, *_ in intervals:
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy
