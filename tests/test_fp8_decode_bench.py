"""The FP8 decode A/B kit on CPU (bench/fp8_decode_gpu.sh's parts): the profiler trace summary against hand-counted
kernels, the decode plans the benchmarks swap (names, JSON round trip, refusals), the plan picked from per-layer
times, and (full tier) the whole kit's dry run: Triton's interpreter, tiny shapes, every step writing its table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import fp8_decode_bench, fp8_variants, step_profile
from realtime_ming.model.kernels import moe_fp8

ROOT = Path(__file__).resolve().parent.parent


def _kernel(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_trace_summary_counts_kernels_busy_time_and_categories():
    """Two steps: overlapping kernels count once in the busy time, gaps not at all; CPU ops are not kernels."""
    events = [
        _kernel("_rms_norm_kernel", 0, 2), _kernel("_decode_gate_up_kernel", 3, 10), _kernel("_decode_down_kernel", 12, 4),
        _kernel("nvjet_hsh_128x64_gemv", 20, 5), {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50},
        _kernel("_rms_norm_kernel", 100, 2), _kernel("_decode_gate_up_kernel", 103, 10),
        _kernel("_decode_down_kernel", 113, 4), _kernel("nvjet_hsh_128x64_gemv", 120, 5),
        _kernel("Memset (Device)", 130, 1, cat="gpu_memset"),
    ]
    out = step_profile.summarize_trace(events, steps=2)
    # step 1: [0,2] + [3,16] (gate_up 3-13 overlapping down 12-16) + [20,25] = 2 + 13 + 5; step 2: 2 + 14 + 5 + 1
    assert out["busy_us_per_step"] == pytest.approx((20 + 22) / 2)
    assert out["launches_per_step"] == pytest.approx(4.5)
    assert out["kernel_us_per_step"] == pytest.approx((2 + 10 + 4 + 5) * 2 / 2 + 0.5)
    cats = {c["category"]: c for c in out["categories"]}
    assert cats["moe gemv (fp8)"]["calls_per_step"] == 2 and cats["moe gemv (fp8)"]["us_per_step"] == 14
    assert cats["rms norm"]["us_per_step"] == 2 and cats["cublas gemm"]["us_per_step"] == 5
    assert cats["copy / fill"]["calls_per_step"] == 0.5
    assert out["kernels"][0]["kernel"] == "_decode_gate_up_kernel"  # the most time first
    lines = step_profile.markdown({**out, "wall_us_per_step": 30.0, "idle_us_per_step": 9.0})
    assert lines[0].startswith("wall 30.0 us a step, GPU busy 21.0 us, idle between kernels 9.0 us, 4 kernels")


def test_kernel_names_fall_into_their_categories():
    assert step_profile.categorize("_decode_down_kernel") == "moe gemv (fp8)"
    assert step_profile.categorize("_moe_gate_up_kernel") == "moe gemv (bf16)"
    assert step_profile.categorize("_gate_up_kernel") == "moe grouped"
    assert step_profile.categorize("_quantize_rows_kernel") == "a8 quantize"
    assert step_profile.categorize("_router_select_kernel") == "router"
    assert step_profile.categorize("_attn_split_kernel") == "attention"
    assert step_profile.categorize("void at::native::vectorized_elementwise_kernel<4>") == "elementwise / reduce"
    assert step_profile.categorize("something_new") == "other"


def test_plans_by_name_and_json(tmp_path):
    """base = GEMVs up to 16 rows with PyTorch's quantisation (before the plan), shipped = moe_fp8's; a JSON plan
    round-trips; a malformed one is refused with its reason; apply puts a plan in force."""
    assert fp8_variants.load("base").path(16) == "gemv" and not fp8_variants.load("base").fused_quantize
    assert fp8_variants.load("shipped") is moe_fp8.DECODE_PLAN
    plan = moe_fp8.DecodePlan(paths=((4, "gemv"), (16, "grouped")), gemv_tiles=((4, {"gu_n": 8, "gu_stages": 3}),),
                              grouped={"block_n": 32})
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(fp8_variants.to_json(plan)))
    assert fp8_variants.load(str(path)) == plan
    for bad in ({"paths": [[16, "gemv"], [4, "grouped"]]}, {"paths": [[4, "fast"]]}):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="ascend"):
            fp8_variants.load(str(path))
    with pytest.raises(ValueError, match="not base, shipped"):
        fp8_variants.load("nope")
    before = moe_fp8.DECODE_PLAN
    try:
        assert fp8_variants.apply("base") is moe_fp8.DECODE_PLAN is fp8_variants.BASE
    finally:
        moe_fp8.DECODE_PLAN = before


def test_picked_plan_takes_the_faster_path_per_row_count():
    """Per decode row count the faster of the GEMVs (shipped or tuned tiles) and the a8 path (its best column
    tile, never the PyTorch-quantised variant); rows above 16 are not in the plan."""
    tuned = {"gu_n": 8, "gu_k": 512, "gu_warps": 4, "gu_stages": 3, "dn_d": 4, "dn_k": 256, "dn_warps": 2,
             "dn_stages": 3}

    def row(gemv, a8, bn32, torch_q, tuned_us=None):
        r = {"experts_read": 8, "gemv": {"us": gemv}, "a8": {"us": a8}, "a8 bn=32": {"us": bn32},
             "a8 torch-q": {"us": torch_q}}
        if tuned_us is not None:
            r.update({"gemv tuned": {"us": tuned_us}, "gemv_tuned_tiles": tuned})
        return r

    rows = {1: row(52, 122, 130, 1, tuned_us=40), 8: row(300, 280, 250, 1), 16: row(570, 379, 390, 1),
            64: {"experts_read": 200, "a8": {"us": 747}}}
    picked = fp8_decode_bench.pick_plan(rows)
    plan = picked["plan"]
    assert plan["paths"] == [[1, "gemv"], [8, "grouped"], [16, "grouped"]]
    assert plan["gemv_tiles"][0] == [1, tuned]
    assert plan["gemv_tiles"][1] == [8, moe_fp8.DECODE_PLAN.tiles(8)]
    assert plan["grouped"] == {}  # at 16 rows the default tile (a8) won
    assert "gemv tuned 40" in picked["why"][1]
    as_plan = fp8_variants.from_json(plan)
    assert [as_plan.path(n) for n in (1, 2, 8, 9, 16, 17)] == ["gemv", "grouped", "grouped", "grouped", "grouped",
                                                              "grouped"]


def test_tp_bench_refuses_an_unknown_fp8_plan(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "tp_bench.py"), "--out", str(tmp_path), "--device",
                           "cpu", "--fp8-plan", "fastest"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "not base, shipped or a JSON file" in proc.stderr


@pytest.mark.slow  # the whole kit in Triton's interpreter (~3 min CPU)
def test_fp8_decode_gpu_script_dry_run_writes_every_table(tmp_path):
    """DRY_RUN=1: the tests' CPU selection, the per-row-count kernel table with a one-candidate sweep and its picked
    plan, and the step A/B over base, shipped and the picked plan (eager, tiny), all in the summary."""
    env = {**os.environ, "DRY_RUN": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "fp8_decode_gpu.sh"), str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (tmp_path / "summary.md").read_text()
    assert "tests rc=0" in proc.stdout and "fp8_decode_bench rc=0" in proc.stdout and "fp8_step_ab rc=0" in proc.stdout
    assert "Plan picked:" in summary and "_GEMV_TILES = (" in summary
    picked = json.loads((tmp_path / "kernels" / "fp8_plan.json").read_text())
    fp8_variants.from_json(picked)
    ab = json.loads((tmp_path / "step" / "fp8_step_ab.json").read_text())
    assert list(ab["plans"]) == ["base", "shipped", str(tmp_path / "kernels" / "fp8_plan.json")]
    assert all(set(r["decode"]) == {"1", "2"} for r in ab["plans"].values())
    assert "| base | 1 | gemv |" in summary
