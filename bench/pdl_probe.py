"""Does programmatic dependent launch (model/kernels/pdl.py) survive CUDA graph capture here, and what does it save a
kernel? Chains of one decode kernel, each launch reading the one before's output, captured with the step plan's
`pdl` off and on, timed per kernel; the PDL graph's DOT dump (torch's `CUDAGraph.debug_dump`) searched for its
programmatic edges.

    python -m bench.pdl_probe [--out DIR] [--launches 200]

Chains: `add_rms_norm` of one 4096-wide row (a short kernel: its time is mostly launch and ramp-up), the dense GEMV
at 1 row over a 4096 x 4096 weight (the step's O projection: a weight stream), and the two alternating. Prints one
line a chain (us a kernel graphed, off -> on) and the edge count; writes DIR/pdl_probe.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from realtime_ming.model.kernels import TRITON, dense_gemv, norm, pdl, step_plan  # noqa: E402

_TILE = dict(k=512, n=4, stages=3, warps=2)  # the shipped plan's 4096 x 4096 tile at one row


def _chains(d: int, launches: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, d, device="cuda", dtype=torch.bfloat16, generator=g)
    w_norm = torch.ones(d, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(d, d, device="cuda", generator=g) * d ** -0.5).to(torch.bfloat16)

    def norms():
        h, s = x, x
        for _ in range(launches):
            h, s = norm.add_rms_norm(s, h, w_norm, 1e-6, kernels=TRITON)
        return h

    def gemvs():
        y = x
        for _ in range(launches):
            y = dense_gemv.gemv(y, w, _TILE)
        return y

    def both():
        y, s = x, x
        for _ in range(launches // 2):
            y, s = norm.add_rms_norm(s, y, w_norm, 1e-6, kernels=TRITON)
            y = dense_gemv.gemv(y, w, _TILE)
        return y

    return {"norm": (norms, launches), "gemv": (gemvs, launches), "norm+gemv": (both, 2 * (launches // 2))}


def _graphed_us(fn, kernels: int, dot: Path | None) -> tuple[float, torch.Tensor]:
    """us a kernel of fn's chain replayed as one CUDA graph (median of 20 replays), and its output."""
    fn()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    if dot is not None:
        graph.enable_debug_mode()
    with torch.cuda.graph(graph):
        out = fn()
    if dot is not None:
        try:  # informational: a torch or driver without the dump leaves the timing standing
            graph.debug_dump(str(dot))
        except RuntimeError as e:
            print(f"pdl probe: no DOT dump ({e})", flush=True)
    times = []
    for _ in range(20):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / kernels)
    return sorted(times)[len(times) // 2], out.clone()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--launches", type=int, default=200)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("pdl_probe needs a CUDA GPU")
    res = {"device": torch.cuda.get_device_name(), "pdl_supported": pdl.supported(torch.device("cuda")), "chains": {}}
    shipped = step_plan.STEP_PLAN
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        for name, (fn, kernels) in _chains(4096, a.launches).items():
            row, outs = {}, []
            for on in (False, True):
                step_plan.STEP_PLAN = dataclasses.replace(shipped, pdl=on)
                dot = Path(tmp) / f"{name}.dot" if on else None
                us, out = _graphed_us(fn, kernels, dot)
                row["pdl_us" if on else "us"] = us
                outs.append(out)
                if dot is not None and dot.is_file():
                    text = dot.read_text(errors="replace").lower()
                    row["dot_programmatic_mentions"] = text.count("programmatic")
            step_plan.STEP_PLAN = shipped
            row["same_bits"] = torch.equal(*outs)
            res["chains"][name] = row
            print(f"pdl probe {name}: {row['us']:.2f} -> {row['pdl_us']:.2f} us a kernel graphed "
                  f"({kernels} launches), same bits {row['same_bits']}, 'programmatic' in the PDL graph's DOT "
                  f"{row.get('dot_programmatic_mentions', 'n/a')}", flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "pdl_probe.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
