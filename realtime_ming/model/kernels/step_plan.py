"""The decode step's launch shapes outside the MoE experts (those: `moe_fp8.DECODE_PLAN`), by row count.

`STEP_PLAN` says, for a decode batch, how the latency-bound kernels around the experts launch:

* `gemv`: the dense projections (QKV, O, the dense MLP, the LM head) through `dense_gemv.linear`'s Triton GEMV,
  ((max rows, {"NxK" or "*": tile or None}), ...) ascending: a projection of N outputs over K inputs at `rows`
  rows takes the first entry whose bound it fits, its "NxK" tile, else its "*" tile; None (or no entry) is
  cuBLAS. A tile: {"n": output rows a program, "k": the K chunk, "warps", "stages": pipelined loads, "dot":
  tensor-core dot over the rows padded to 16}.
* `rotary_heads`: heads a program of `rotary.head_rotary` (0: every head of a token in one program).
* `router_splits` / `router_block_e`: the router logits' split-K and experts a program; `select_warps`: the
  warps of the one-program-a-token expert selection (1: its reductions stay within a warp).
* `pdl`: the decode step's Triton kernels launch with programmatic dependent launch (`pdl.py`: each one's weight
  loads and launch overlap the kernel before; Hopper and later, else ignored).

Every choice changes only how the work is split, never what is computed: the rotary and the selection give the
same bits whatever the plan (the selection's renormalising sum over the top-k may differ in its last bit); the
GEMV sums K in another order than cuBLAS (fp32 accumulation, one rounding to the model dtype, as cuBLAS); `pdl`
changes when a kernel starts, not what it computes (the same bits: tests/test_pdl_kernels.py). The shipped plan is what `bench/decode_step_bench.py` measured on one H200; benchmarks A/B others by replacing
`STEP_PLAN` before graphs are captured (bench/fp8_variants.py).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["STEP_PLAN", "StepPlan", "from_json", "step_plan", "to_json"]

_TILE_KEYS = {"n", "k", "warps", "stages", "dot"}


@dataclass(frozen=True)
class StepPlan:
    gemv: tuple[tuple[int, dict], ...] = ()
    rotary_heads: int = 0
    router_splits: int = 16
    router_block_e: int = 32
    select_warps: int = 4
    pdl: bool = False

    def __post_init__(self) -> None:
        bounds = [b for b, _ in self.gemv]
        if bounds != sorted(bounds) or any(b < 1 for b in bounds):
            raise ValueError(f"gemv bounds must ascend from 1: {bounds}")
        for _, tiles in self.gemv:
            for key, tile in tiles.items():
                if tile is not None and (set(tile) - _TILE_KEYS or not {"n", "k", "warps"} <= set(tile)):
                    raise ValueError(f"gemv tile {key}: {tile} (keys: n, k, warps, optional stages, dot)")
        for name in ("rotary_heads", "router_splits", "router_block_e", "select_warps"):
            v = getattr(self, name)
            if v < (0 if name == "rotary_heads" else 1) or v & (v - 1) and name != "router_splits":
                raise ValueError(f"{name} must be a power of two (rotary_heads may be 0), got {v}")
        if not isinstance(self.pdl, bool):
            raise ValueError(f"pdl must be true or false, got {self.pdl!r}")

    def gemv_tile(self, rows: int, n: int, k: int) -> dict | None:
        """The GEMV tile of an N x K projection at `rows` rows, or None: cuBLAS."""
        for bound, tiles in self.gemv:
            if rows <= bound:
                tile = tiles.get(f"{n}x{k}", tiles.get("*"))
                return dict(tile) if tile else None
        return None


# the tiles the plan picked most often: tensor cores (2-8 rows) and a narrow one without (1-2 rows)
_DOT = dict(dot=True, k=256, n=32, stages=4, warps=4)
_NARROW = dict(k=512, n=4, stages=3, warps=2)
# Picked by bench/decode_step_bench.py at the real shapes on one H200 (TP=1; other shapes keep cuBLAS), with the
# kernels' compiled tests green: bench/results/gpu-h200-decode-step-2026-11-29. PDL on after its compiled tests
# (same bits, graphed = eager): bs=1 3.155 -> 2.915 ms a step, bench/results/gpu-h200-pdl-2026-11-29.
STEP_PLAN = StepPlan(
    gemv=(
        (1, {
            "5120x4096": None,
            "4096x4096": _NARROW,
            "18432x4096": dict(k=256, n=4, stages=3, warps=2),
            "4096x9216": _NARROW,
            "157184x4096": dict(k=256, n=4, stages=3, warps=2),
        }),
        (2, {
            "5120x4096": None,
            "4096x4096": _NARROW,
            "18432x4096": dict(dot=True, k=128, n=32, stages=3, warps=4),
            "4096x9216": dict(k=512, n=8, stages=3, warps=4),
            "157184x4096": _DOT,
        }),
        (4, {
            "5120x4096": None,
            "4096x4096": _DOT,
            "18432x4096": dict(dot=True, k=128, n=64, stages=3, warps=4),
            "4096x9216": _DOT,
            "157184x4096": _DOT,
        }),
        (8, {
            "5120x4096": None,
            "4096x4096": _DOT,
            "18432x4096": dict(dot=True, k=128, n=32, stages=3, warps=4),
            "4096x9216": _DOT,
            "157184x4096": _DOT,
        }),
    ),
    rotary_heads=8, router_splits=8, router_block_e=32, select_warps=1, pdl=True,
)


def step_plan() -> StepPlan:
    """The plan in force (module-level, so benchmarks can swap it before graphs are captured)."""
    return STEP_PLAN


def to_json(plan: StepPlan) -> dict:
    return {"gemv": [[b, dict(t)] for b, t in plan.gemv], "rotary_heads": plan.rotary_heads,
            "router_splits": plan.router_splits, "router_block_e": plan.router_block_e,
            "select_warps": plan.select_warps, "pdl": plan.pdl}


def from_json(data: dict) -> StepPlan:
    unknown = set(data) - {"gemv", "rotary_heads", "router_splits", "router_block_e", "select_warps", "pdl"}
    if unknown:
        raise ValueError(f"unknown step plan keys {sorted(unknown)}")
    default = StepPlan()
    return StepPlan(gemv=tuple((int(b), dict(t)) for b, t in data.get("gemv") or ()),
                    rotary_heads=int(data.get("rotary_heads", default.rotary_heads)),
                    router_splits=int(data.get("router_splits", default.router_splits)),
                    router_block_e=int(data.get("router_block_e", default.router_block_e)),
                    select_warps=int(data.get("select_warps", default.select_warps)),
                    pdl=data.get("pdl", default.pdl))
