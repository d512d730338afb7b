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

Every choice changes only how the work is split, never what is computed: the rotary and the selection give the
same bits whatever the plan (the selection's renormalising sum over the top-k may differ in its last bit); the
GEMV sums K in another order than cuBLAS (fp32 accumulation, one rounding to the model dtype, as cuBLAS).
The shipped plan is what `bench/decode_step_bench.py` measured on one H200; benchmarks A/B others by replacing
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

    def gemv_tile(self, rows: int, n: int, k: int) -> dict | None:
        """The GEMV tile of an N x K projection at `rows` rows, or None: cuBLAS."""
        for bound, tiles in self.gemv:
            if rows <= bound:
                tile = tiles.get(f"{n}x{k}", tiles.get("*"))
                return dict(tile) if tile else None
        return None


# cuBLAS and the launch shapes of before until a measurement picks others (bench/decode_step_bench.py)
STEP_PLAN = StepPlan()


def step_plan() -> StepPlan:
    """The plan in force (module-level, so benchmarks can swap it before graphs are captured)."""
    return STEP_PLAN


def to_json(plan: StepPlan) -> dict:
    return {"gemv": [[b, dict(t)] for b, t in plan.gemv], "rotary_heads": plan.rotary_heads,
            "router_splits": plan.router_splits, "router_block_e": plan.router_block_e,
            "select_warps": plan.select_warps}


def from_json(data: dict) -> StepPlan:
    unknown = set(data) - {"gemv", "rotary_heads", "router_splits", "router_block_e", "select_warps"}
    if unknown:
        raise ValueError(f"unknown step plan keys {sorted(unknown)}")
    default = StepPlan()
    return StepPlan(gemv=tuple((int(b), dict(t)) for b, t in data.get("gemv") or ()),
                    rotary_heads=int(data.get("rotary_heads", default.rotary_heads)),
                    router_splits=int(data.get("router_splits", default.router_splits)),
                    router_block_e=int(data.get("router_block_e", default.router_block_e)),
                    select_warps=int(data.get("select_warps", default.select_warps)))
