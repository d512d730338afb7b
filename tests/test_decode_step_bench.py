"""The decode-step A/B kit on CPU (bench/decode_step_gpu.sh's parts): the step plan and the FP8 plan picked from
fabricated times (cuBLAS kept unless a tile is clearly faster and right), `PLAN+step=STEP_PLAN` specs, and (full
tier) the whole kit's dry run: Triton's interpreter, tiny shapes, every step writing its table."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from bench import decode_step_bench, fp8_variants, step_profile
from realtime_ming.model.kernels import moe_fp8, step_plan
from realtime_ming.model.kernels.step_plan import StepPlan

ROOT = Path(__file__).resolve().parent.parent
TILE = {"n": 4, "k": 512, "warps": 2, "stages": 3}
DOT = {"n": 32, "k": 128, "warps": 4, "stages": 3, "dot": True}


def _gemv_row(n, k, rows, cublas, tiles):
    times = {"cublas": {"us": cublas, "rel_err": 0.002}}
    times.update({json.dumps(t, sort_keys=True): {"us": us, "rel_err": err} for t, us, err in tiles})
    return {"n": n, "k": k, "rows": rows, "times": times}


def test_gemv_tiles_are_picked_only_when_faster_and_right():
    """Per row count and shape: the fastest tile within bf16 rounding of the truth, if >= 3 % under cuBLAS; a
    faster but wrong tile is never picked; cuBLAS (None) otherwise."""
    results = {
        "a": _gemv_row(5120, 4096, 1, 12.0, [(TILE, 9.0, 0.003), (DOT, 8.0, 0.5)]),  # DOT wrong: TILE
        "b": _gemv_row(4096, 4096, 1, 10.0, [(TILE, 9.9, 0.003)]),  # 1 % faster: cuBLAS
        "c": _gemv_row(5120, 4096, 8, 14.0, [(TILE, 15.0, 0.003), (DOT, 11.0, 0.003)]),
    }
    plan = StepPlan(gemv=decode_step_bench.pick_gemv(results, [1, 8]))
    assert plan.gemv_tile(1, 5120, 4096) == TILE and plan.gemv_tile(1, 4096, 4096) is None
    assert plan.gemv_tile(8, 5120, 4096) == DOT and plan.gemv_tile(5, 5120, 4096) == DOT
    assert plan.gemv_tile(9, 5120, 4096) is None and plan.gemv_tile(1, 64, 64) is None


def test_launch_shapes_pick_the_least_relative_time_with_the_same_experts():
    rotary = {1: {0: 6.0, 2: 2.0, 4: 2.5}, 64: {0: 20.0, 2: 30.0, 4: 19.0}}  # 2: 1/3 + 3/2; 4: 5/12 + 19/20
    assert decode_step_bench._pick_min(rotary) == 4
    router = {1: {"16x32 w4": {"us": 10.0, "same_experts": True}, "8x32 w1": {"us": 4.0, "same_experts": False},
                  "16x32 w1": {"us": 6.0, "same_experts": True}}}
    assert decode_step_bench._pick_min(router) == "16x32 w1"  # the faster one chose other experts: never


def test_fp8_plan_takes_a_down_tile_only_where_it_wins():
    shipped = moe_fp8.DECODE_PLAN.tiles(1)
    better = {**shipped, "dn_all": 1, "dn_d": 8, "dn_k": 128}
    moe = {1: {"shipped": {"us": 40.0, "rel_err": 0.032, "tiles": shipped},
               "all a": {"us": 35.0, "rel_err": 0.032, "tiles": better},
               "all b": {"us": 30.0, "rel_err": 0.2, "tiles": {**better, "dn_d": 2}}},  # wrong: never
           8: {"shipped": {"us": 225.0, "rel_err": 0.031, "tiles": moe_fp8.DECODE_PLAN.tiles(8)},
               "all a": {"us": 224.0, "rel_err": 0.031, "tiles": better}}}
    plan = fp8_variants.from_json(decode_step_bench.pick_fp8_plan(moe))
    assert plan.tiles(1) == better and plan.tiles(8) == moe_fp8.DECODE_PLAN.tiles(8)
    assert plan.paths == moe_fp8.DECODE_PLAN.paths and plan.tiles(2) == moe_fp8.DECODE_PLAN.tiles(2)


def test_plan_specs_with_a_step_plan(tmp_path):
    """`SPEC+step=PATH` puts both plans in force; without it the shipped step plan; a missing file is refused; a
    trailing `+pdl` turns the step plan's PDL on, `+nopdl` off."""
    path = tmp_path / "step_plan.json"
    mine = StepPlan(gemv=((1, {"*": TILE}),), rotary_heads=4, select_warps=1)
    path.write_text(json.dumps(step_plan.to_json(mine)))
    before = (moe_fp8.DECODE_PLAN, step_plan.STEP_PLAN)
    try:
        assert fp8_variants.apply(f"base+step={path}") is fp8_variants.BASE and step_plan.STEP_PLAN == mine
        fp8_variants.apply("shipped")
        assert step_plan.STEP_PLAN is fp8_variants.SHIPPED_STEP
        with pytest.raises(ValueError, match="not a JSON file"):
            fp8_variants.load(f"shipped+step={tmp_path / 'nope.json'}")
        # a trailing +pdl: the same plans with the step plan's PDL on
        assert fp8_variants.apply("shipped+pdl") is fp8_variants.SHIPPED
        assert step_plan.STEP_PLAN == dataclasses.replace(fp8_variants.SHIPPED_STEP, pdl=True)
        fp8_variants.apply(f"base+step={path}+pdl")
        assert step_plan.STEP_PLAN == dataclasses.replace(mine, pdl=True) and fp8_variants.SHIPPED_STEP.pdl
        assert fp8_variants.apply("shipped+nopdl") is fp8_variants.SHIPPED
        assert step_plan.STEP_PLAN == dataclasses.replace(fp8_variants.SHIPPED_STEP, pdl=False)
        with pytest.raises(ValueError, match="not base, shipped"):
            fp8_variants.load("shipped+pdl+pdl")
    finally:
        moe_fp8.DECODE_PLAN, step_plan.STEP_PLAN = before
    assert step_profile.categorize("_gemv_kernel") == "dense gemv (triton)"


@pytest.mark.slow  # the whole kit in Triton's interpreter (~3 min CPU)
def test_decode_step_gpu_script_dry_run_writes_every_table(tmp_path):
    """DRY_RUN=1: the tests' CPU selection, the kernels' tables and picked plans, and the step A/B over the shipped
    plans and the picked ones (eager, tiny), all in the summary."""
    env = {**os.environ, "DRY_RUN": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "decode_step_gpu.sh"), str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "tests rc=0" in out and "decode_step_bench rc=0" in out and "fp8_step_ab rc=0" in out
    summary = (tmp_path / "summary.md").read_text()
    assert "STEP_PLAN = StepPlan(gemv=(" in summary and "| rotary, heads a program |" in summary
    assert "_GEMV_TILES = (" in summary
    k = tmp_path / "kernels"
    for name in ("step_plan", "step_plan_gemv", "step_plan_launch"):
        step_plan.from_json(json.loads((k / f"{name}.json").read_text()))
    fp8_variants.from_json(json.loads((k / "fp8_plan.json").read_text()))
    ab = json.loads((tmp_path / "step" / "fp8_step_ab.json").read_text())
    assert list(ab["plans"]) == ["shipped", f"{k}/fp8_plan.json+step={k}/step_plan.json", f"shipped+step={k}/step_plan.json",
                                 f"{k}/fp8_plan.json", f"shipped+step={k}/step_plan_gemv.json"]
    assert all(set(r["decode"]) == {"1", "2"} for r in ab["plans"].values())
    assert "| fp8_plan.json+step=step_plan.json | 1 |" in summary


@pytest.mark.slow  # the PDL kit's CPU selection and its A/B in Triton's interpreter (~1.5 min CPU)
def test_pdl_gpu_script_dry_run_runs_the_three_plans_in_turn(tmp_path):
    """DRY_RUN=1 of bench/pdl_gpu.sh: the PDL tests' CPU selection, then shipped+nopdl, shipped (PDL on) and the
    QKV-through-the-GEMV plan with PDL, each timed in two rounds, their step plans as named."""
    env = {**os.environ, "DRY_RUN": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "pdl_gpu.sh"), str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tests rc=0" in proc.stdout and "fp8_step_ab rc=0" in proc.stdout
    qkv = tmp_path / "step_plan_qkv_gemv.json"
    mine = step_plan.from_json(json.loads(qkv.read_text()))
    assert all(tiles["5120x4096"] == tiles["4096x4096"] for _, tiles in mine.gemv) and mine.pdl
    ab = json.loads((tmp_path / "step" / "fp8_step_ab.json").read_text())
    assert list(ab["plans"]) == ["shipped+nopdl", "shipped", f"shipped+step={qkv}"]
    assert [r["step_plan"]["pdl"] for r in ab["plans"].values()] == [False, True, True]
    assert all(len(d["rounds_ms"]) == 2 for r in ab["plans"].values() for d in r["decode"].values())
    assert "| shipped+nopdl | 1 |" in (tmp_path / "summary.md").read_text()
