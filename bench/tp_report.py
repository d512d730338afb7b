"""The tensor-parallel thinker benchmark's report (bench/tp_bench.py): rank 0's results as JSON and markdown,
rewritten after every stage so that a cut-off run keeps its numbers, the machine they ran on, and the comparison
with the anchors.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from pathlib import Path

import step_profile
import torch

__all__ = ["ANCHOR_TOK_S", "TARGET_TOK_S", "Report", "device_info", "markdown"]

ANCHOR_TOK_S = 138.0  # sglang-omni thinker decode, TP=4 on H100 (issue 8)
TARGET_TOK_S = 300.0  # issue 4: per stream at c=1 on the full model


def device_info(device: torch.device, rank: int) -> dict:
    """The machine in the report's meta: torch, Python, CPUs; on rank 0 of a GPU run the GPU, `nvidia-smi` and its
    link topology."""
    info = {"torch": torch.__version__, "python": platform.python_version(), "host_cpus": os.cpu_count()}
    if device.type != "cuda" or rank != 0:
        info["device"] = "cpu"
        return info
    info["device"] = torch.cuda.get_device_name(device)
    info["gpu_count_visible"] = torch.cuda.device_count()
    for key, cmd in (("nvidia_smi", ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version",
                                     "--format=csv,noheader"]), ("nvidia_smi_topo", ["nvidia-smi", "topo", "-m"])):
        try:
            text = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False).stdout.strip()
            info[key] = re.sub(r"\x1b\[[0-9;]*m", "", text)  # topo -m underlines its header
        except (OSError, subprocess.SubprocessError) as exc:
            info[key] = f"unavailable: {exc}"
    return info


class Report:
    """Rank 0's results: JSON + markdown rewritten after every stage (a cut-off run keeps its numbers)."""

    def __init__(self, out: Path, meta: dict, enabled: bool):
        self.out, self.enabled = out, enabled
        self.data: dict = {"meta": meta, "notes": []}
        self.t0 = time.time()
        if enabled:
            out.mkdir(parents=True, exist_ok=True)

    def log(self, text: str) -> None:
        if self.enabled:
            print(f"[{time.time() - self.t0:6.1f} s] {text}", flush=True)

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.log(f"note: {text}")
        self.save()

    def put(self, key: str, value) -> None:
        self.data[key] = value
        self.save()

    def save(self) -> None:
        if not self.enabled:
            return
        self.data["meta"]["elapsed_s"] = round(time.time() - self.t0, 1)
        (self.out / "tp_bench.json").write_text(json.dumps(self.data, indent=1, default=str))
        (self.out / "tp_bench.md").write_text(markdown(self.data))


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def _table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]


def markdown(data: dict) -> str:
    """The report as markdown: meta, prefill/TTFT, decode per bucket, comparison with the anchors."""
    meta = data["meta"]
    lines = [f"# Thinker tensor-parallel benchmark, TP={meta.get('tp')} — {meta.get('device')}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k not in ("nvidia_smi_topo",)]
    if meta.get("nvidia_smi_topo"):
        lines += ["", "GPU links (`nvidia-smi topo -m`):", "", "```", meta["nvidia_smi_topo"], "```"]
    pre = data.get("prefill", {})
    if pre:
        lines += ["", "## (a) Prefill → first token (thinker only; audio encoder not included)", ""]
        lines += _table(["batch", "tokens per row", "median ms", "min ms"],
                        [[k, v["tokens_per_row"], v["median_ms"], v["min_ms"]] for k, v in pre.items()])
    dec, coll, floor = data.get("decode", {}), data.get("collectives_ms", {}), data.get("floor", {})
    if dec:
        lines += ["", "## (b) Decode step per batch bucket (each row its own slot at a different length)", ""]
        rows = []
        for b, r in dec.items():
            fl = floor.get(b) or floor.get(str(b)) or {}
            rows.append([b, r.get("eager_ms"), r.get("eager_tok_s_per_stream"), r.get("graph_ms"),
                         r.get("graph_tok_s_per_stream"), r.get("graph_tok_s_aggregate"),
                         coll.get(b, coll.get(str(b))), fl.get("floor_ms")])
        lines += _table(["B", "eager ms", "eager tok/s/stream", "graph ms", "graph tok/s/stream",
                         "graph tok/s aggregate", "collectives alone ms", "bytes floor ms"], rows)
    graphed = any("graph_ms" in r for r in dec.values())
    mode = "graph" if graphed else "eager"
    row1 = dec.get(1) or dec.get("1") or {}
    top = max((int(b) for b in dec), default=None)
    row_top = (dec.get(top) or dec.get(str(top)) or {}) if top else {}
    c1 = row1.get(f"{mode}_tok_s_per_stream")
    agg = top * row_top[f"{mode}_tok_s_per_stream"] if f"{mode}_tok_s_per_stream" in row_top else None
    first = (pre.get("B1") or {}).get("median_ms")
    lines += ["", "## (c) Against the anchors", ""]
    lines += _table(["metric", "ours", "sglang-omni (TP=4, H100)", "target (issue 4)"],
                    [[f"thinker decode tok/s per stream, c=1 ({mode})", c1, ANCHOR_TOK_S, TARGET_TOK_S],
                     [f"thinker decode tok/s aggregate, c={top} ({mode})", agg, None, None],
                     ["thinker prefill → first token ms, c=1", first, None, None]])
    if data.get("greedy"):
        lines += ["", f"Greedy check (slot 0 after the B=1 prompt): `{json.dumps(data['greedy'])}`"]
    if data.get("memory"):
        lines += ["", "## Memory per rank (GiB)", ""]
        lines += _table(["rank", "weights + cache allocated", "peak allocated"],
                        [[m["rank"], m["allocated_GiB"], m["peak_GiB"]] for m in data["memory"]])
    for b, prof in (data.get("profile") or {}).items():
        lines += ["", f"## Graphed step B={b} under the profiler", ""] + step_profile.markdown(prof)
    if data.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in data["notes"]]
    return "\n".join(lines) + "\n"
