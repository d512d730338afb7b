"""Compile the decode step's Triton kernels for an H200 (sm_90) without a GPU, PDL off and on, and report where their
grid dependency controls sit in the PTX. Run as a script (Triton compiled, not interpreted: TRITON_INTERPRET unset):

    python3 tests/pdl_ptx_support.py        # prints {kernel: {"off": {...}, "on": {...}}} as JSON

Per variant: `launch_dependents` / `wait` (how many griddepcontrol instructions of each), `first_release` /
`first_wait` (their first line, -1 if none) and `loads_before_wait` (global loads, plain or async, above the wait).
Nothing here is a test (tests/test_pdl_kernels.py asserts on it).
"""

from __future__ import annotations

import inspect
import json
import re

_FLOATS = {"eps", "scale"}
_FP8 = {"w_ptr": "fp8e4nv", "ws_ptr": "fp32", "ids_ptr": "i64", "wts_ptr": "fp32", "live_ptr": "i1"}


def _kernels():
    """(name, kernel, pointer dtypes other than bf16, constexprs without PDL, num_warps) at the shipped tiles."""
    from realtime_ming.model.kernels import dense_gemv, moe_decode, moe_fp8, norm

    return [
        ("gemv", dense_gemv._gemv_kernel, {},
         dict(M_PAD=1, BLOCK_N=4, BLOCK_K=512, STAGES=3, DOT=False, UPCAST=False), 2),
        ("gemv_dot", dense_gemv._gemv_kernel, {},
         dict(M_PAD=16, BLOCK_N=32, BLOCK_K=256, STAGES=4, DOT=True, UPCAST=False), 4),
        ("fp8_gate_up", moe_fp8._decode_gate_up_kernel, _FP8,
         dict(TOPK=8, BLOCK_N=2, BLOCK_K=256, HAS_LIVE=False, STAGES=3), 2),
        ("fp8_down_all", moe_fp8._decode_down_all_kernel, _FP8,
         dict(TOPK=8, TOPK_P=8, BLOCK_D=4, BLOCK_K=128, HAS_LIVE=True, STAGES=3), 2),
        ("router_logits", moe_decode._router_logits_kernel, {"part_ptr": "fp32"},
         dict(SPLITS=8, BLOCK_E=32, BLOCK_K=256), 4),
        ("rms_norm", norm._rms_norm_kernel, {}, dict(HAS_RES=True, ROWS=1, BLOCK=4096), 8),
    ]


def _ptx(fn, ptrs: dict, consts: dict, warps: int, pdl: bool) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    params = list(inspect.signature(fn.fn).parameters)
    consts = {**consts, "PDL": pdl}
    sig = {p: "constexpr" if p in consts else "*" + ptrs.get(p, "bf16") if p.endswith("_ptr")
           else "fp32" if p in _FLOATS else "i32" for p in params}
    src = ASTSource(fn=fn, signature=sig, constexprs={(params.index(k),): v for k, v in consts.items()})
    opts = {"num_warps": warps, **({"launch_pdl": True} if pdl else {})}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]


def _where(ptx: str) -> dict:
    lines = ptx.splitlines()

    def first(pattern: str) -> int:
        return next((i for i, line in enumerate(lines) if re.search(pattern, line)), -1)

    wait = first(r"griddepcontrol\.wait")
    above = lines[:wait] if wait >= 0 else []
    return {"launch_dependents": ptx.count("griddepcontrol.launch_dependents"),
            "wait": ptx.count("griddepcontrol.wait"), "first_release": first(r"griddepcontrol\.launch_dependents"),
            "first_wait": wait, "loads_before_wait": sum(bool(re.search(r"ld\.global|cp\.async\.c", x)) for x in above)}


def main() -> None:
    out = {name: {v: _where(_ptx(fn, ptrs, consts, warps, v == "on")) for v in ("off", "on")}
           for name, fn, ptrs, consts, warps in _kernels()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
