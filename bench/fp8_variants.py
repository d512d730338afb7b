"""The FP8 decode plans the benchmarks A/B (`moe_fp8.DECODE_PLAN`, swapped before a model's graphs are captured).

A plan is named by SPEC: `base` (before the per-row-count plan: the FP8 GEMVs for every decode batch up to 16 rows,
the bf16 GEMVs' tiles, the a8 activations quantised by PyTorch's ops), `shipped` (the plan in
model/kernels/moe_fp8.py), or the path of a JSON plan (`bench/fp8_decode_bench.py` writes the one its measurements
pick: DIR/fp8_plan.json). `SPEC+step=PATH` also puts a step plan in force (model/kernels/step_plan.py: the dense
GEMV's tiles, the rotary's and router's launch shapes; bench/decode_step_bench.py writes the one it picks); without
it the shipped step plan. A trailing `+pdl` turns the step plan's `pdl` on, `+nopdl` off (the decode kernels launched
with programmatic dependent launch: model/kernels/pdl.py; the shipped plan has it on), e.g. `shipped+nopdl`,
`shipped+step=PATH+pdl`. Benchmarks only:
the engine has no setting for either.
"""

from __future__ import annotations

import json
import dataclasses
from pathlib import Path

from realtime_ming.model.kernels import moe_fp8, step_plan
from realtime_ming.model.kernels.moe_decode import MAX_DECODE_TOKENS

__all__ = ["BASE", "SHIPPED", "apply", "from_json", "load", "load_step", "to_json"]

SHIPPED = moe_fp8.DECODE_PLAN
SHIPPED_STEP = step_plan.STEP_PLAN
BASE = moe_fp8.DecodePlan(paths=((MAX_DECODE_TOKENS, "gemv"),), fused_quantize=False)


def to_json(plan: moe_fp8.DecodePlan) -> dict:
    return {"paths": [list(p) for p in plan.paths], "gemv_tiles": [[n, dict(t)] for n, t in plan.gemv_tiles],
            "fused_quantize": plan.fused_quantize, "grouped": dict(plan.grouped)}


def from_json(data: dict) -> moe_fp8.DecodePlan:
    paths = tuple((int(n), str(p)) for n, p in data["paths"])
    if any(p not in ("gemv", "grouped") for _, p in paths) or list(paths) != sorted(paths, key=lambda e: e[0]):
        raise ValueError(f"plan paths must ascend by rows and name gemv or grouped: {data['paths']}")
    tiles = tuple((int(n), dict(t)) for n, t in data.get("gemv_tiles") or to_json(SHIPPED)["gemv_tiles"])
    return moe_fp8.DecodePlan(paths=paths, gemv_tiles=tiles, fused_quantize=bool(data.get("fused_quantize", True)),
                              grouped=dict(data.get("grouped") or {}))


_PDL = {"+pdl": True, "+nopdl": False}


def _pdl_suffix(spec: str) -> tuple[str, bool | None]:
    """(SPEC without its trailing `+pdl` / `+nopdl`, the PDL it asks for or None)."""
    for suffix, on in _PDL.items():
        if spec.endswith(suffix):
            return spec.removesuffix(suffix), on
    return spec, None


def load_step(spec: str) -> step_plan.StepPlan:
    """The step plan SPEC names: its `+step=PATH` JSON file, else the shipped one; `pdl` on with a trailing `+pdl`,
    off with `+nopdl`, else as that plan has it."""
    spec, pdl = _pdl_suffix(spec)
    if "+step=" not in spec:
        plan = SHIPPED_STEP
    else:
        path = Path(spec.split("+step=", 1)[1])
        if not path.is_file():
            raise ValueError(f"step plan {str(path)!r}: not a JSON file")
        plan = step_plan.from_json(json.loads(path.read_text()))
    return plan if pdl is None else dataclasses.replace(plan, pdl=pdl)


def load(spec: str) -> moe_fp8.DecodePlan:
    """The FP8 plan SPEC names (see the module docstring; its `+step=` and `+pdl` parts checked too)."""
    load_step(spec)
    spec = _pdl_suffix(spec)[0].split("+step=", 1)[0]
    if spec == "base":
        return BASE
    if spec == "shipped":
        return SHIPPED
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"FP8 plan {spec!r}: not base, shipped or a JSON file")
    return from_json(json.loads(path.read_text()))


def apply(spec: str) -> moe_fp8.DecodePlan:
    """Put the plans SPEC names (FP8 and step) in force for this process (before graphs are captured); returns the
    FP8 plan."""
    moe_fp8.DECODE_PLAN = load(spec)
    step_plan.STEP_PLAN = load_step(spec)
    return moe_fp8.DECODE_PLAN
