"""FP8 against bf16 routed experts at the real Ming-flash-omni-2.0 shapes on one GPU: kernel time and per-layer error.

    python -m bench.fp8_kernel_bench --out DIR [--tp 1] [--tokens 1,16,64,512,2048]

One MoE layer (one rank of TP=--tp: 256 experts of width 1024/tp) with dummy weights: the bf16 stacks N(0, 1/in)
and their FP8 quantisation (model/fp8.py, per-output-channel scales). Per token count N, routed by a random
router through the real selection (top-8 of 256, group-limited):

* time, graphed (bench/kernel_bench.py's `graphed_us`): N <= 16 the decode kernels (moe_decode vs moe_fp8.moe_decode,
  routed + shared expert); every N the grouped kernels the engine runs above 16 rows and for prefill / mixed chunks
  (moe_experts.fused_experts vs moe_fp8.fused_experts with a8 = fp8 tensor cores, and weight-only);
* error: each path's output against the same layer in fp32 (the bf16 weights upcast, fp32 math): the relative L2
  error of bf16 and of FP8, and FP8 against bf16 -- the per-layer output error at full shapes;
* the whole SparseMoeBlock (router, experts, shared expert) with fp8 experts against the bf16 block: output
  error, and the share of (token, expert) choices of the NEXT layer's router that the difference flips.
Writes DIR/fp8_kernel_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_bench import graphed_us  # noqa: E402

from realtime_ming.model import fp8, moe  # noqa: E402
from realtime_ming.model.kernels import TRITON  # noqa: E402
from realtime_ming.model.kernels import moe_decode as md  # noqa: E402
from realtime_ming.model.kernels import moe_fp8  # noqa: E402
from realtime_ming.model.kernels.moe_experts import fused_experts  # noqa: E402
from realtime_ming.model.layers import TPGroup  # noqa: E402
from realtime_ming.model.loader import init_dummy  # noqa: E402
from realtime_ming.model.presets import preset_config  # noqa: E402

DEV, BF16 = "cuda", torch.bfloat16


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


class Experts:
    """One rank's routed + shared experts at the real shapes: bf16, their fp8 quantisation, and the router."""

    def __init__(self, tp: int, seed: int = 0, cfg=None, device: str = DEV, dtype: torch.dtype = BF16):
        c = cfg or preset_config("ming-flash-omni-2.0").thinker
        self.c, self.d, self.inter, self.device = c, c.hidden_size, c.moe_intermediate_size // tp, device
        g = torch.Generator(device).manual_seed(seed)

        def w(*shape):
            return (torch.randn(*shape, device=device, generator=g) * shape[-1] ** -0.5).to(dtype)

        e = c.num_experts
        self.w_gu, self.w_dn = w(e, 2 * self.inter, self.d), w(e, self.d, self.inter)
        self.q_gu, self.s_gu = self._quantize(self.w_gu)
        self.q_dn, self.s_dn = self._quantize(self.w_dn)
        self.sg, self.su, self.sd = w(self.inter, self.d), w(self.inter, self.d), w(self.d, self.inter)
        self.gate = w(e, self.d)
        self.bias = (0.05 * torch.randn(e, device=device, generator=g)).to(dtype)

    @staticmethod
    def _quantize(stack):
        q = torch.empty_like(stack, dtype=fp8.FP8)
        s = torch.empty(stack.shape[:2], device=stack.device)
        for i in range(stack.shape[0]):
            q[i], s[i] = fp8.quantize(stack[i])
        return q, s

    def route(self, x):
        c = self.c
        return moe.select_experts(F.linear(x.float(), self.gate.float()), self.bias, c.num_experts_per_tok,
                                  c.n_group, c.topk_group, c.routed_scaling_factor)


def kernel_rows(ex: Experts, n: int) -> dict:
    x = torch.randn(n, ex.d, device=DEV, dtype=BF16)
    ids, weights = ex.route(x)
    calls = 50 if n <= 64 else 10
    shared = (ex.sg, ex.su, ex.sd)
    with torch.no_grad():
        truth = moe.experts_grouped(x.float(), ids, weights, ex.w_gu.float(), ex.w_dn.float())
    row = {"experts_read": int(ids.unique().numel())}
    paths = {"bf16 grouped": lambda: fused_experts(x, ids, weights, ex.w_gu, ex.w_dn),
             "fp8 grouped a8": lambda: moe_fp8.fused_experts(x, ids, weights, ex.q_gu, ex.q_dn, ex.s_gu, ex.s_dn),
             "fp8 grouped w8a16": lambda: moe_fp8.fused_experts(x, ids, weights, ex.q_gu, ex.q_dn, ex.s_gu, ex.s_dn,
                                                                a8=False)}
    if n <= md.MAX_DECODE_TOKENS:  # the decode kernels add the shared expert: compare the routed part only by error
        paths["bf16 decode"] = lambda: md.moe_decode(x, ids, weights, ex.w_gu, ex.w_dn, *shared, kernels=TRITON)
        paths["fp8 decode"] = lambda: moe_fp8.moe_decode(x, ids, weights, ex.q_gu, ex.q_dn, *shared, ex.s_gu, ex.s_dn,
                                                         kernels=TRITON)
        shared_out = F.linear(F.silu(F.linear(x, ex.sg)) * F.linear(x, ex.su), ex.sd).float()
    outs = {}
    for name, fn in paths.items():
        with torch.no_grad():
            out = fn().float()
        outs[name] = out - shared_out if "decode" in name else out
        row[name] = {"us": round(graphed_us(fn, calls=calls), 2), "rel_err_vs_fp32": round(_rel(outs[name], truth), 5)}
    for kind in ("grouped", "decode"):
        if f"fp8 {kind}" in outs or f"fp8 {kind} a8" in outs:
            fp8_out = outs.get(f"fp8 {kind}", outs.get(f"fp8 {kind} a8"))
            row[f"fp8_vs_bf16_{kind}_rel_err"] = round(_rel(fp8_out, outs[f"bf16 {kind}"]), 5)
    return row


def block_rows(tp: int, tokens: list[int]) -> dict:
    """A whole SparseMoeBlock with fp8 experts (the quantised dummy weights of the bf16 block) against the bf16 one."""
    c = preset_config("ming-flash-omni-2.0").thinker
    group = TPGroup(0, tp, shadow=True) if tp > 1 else TPGroup()
    blocks = {}
    for experts in ("model", "fp8"):
        with torch.device("meta"):
            blocks[experts] = moe.SparseMoeBlock(c, group, kernels=TRITON, expert_dtype=experts)
        init_dummy(blocks[experts], seed=3, device=DEV, dtype=BF16)
    nxt = torch.randn(c.num_experts, c.hidden_size, device=DEV)
    out = {}
    for n in tokens:
        x = torch.randn(1, n, c.hidden_size, device=DEV, dtype=BF16)
        with torch.no_grad():
            y = {k: b(x)[0] for k, b in blocks.items()}
        # the next layer's router on x + y (the residual stream): how many of its top-8 choices FP8 changes
        top = {k: (x[0].float() + v.float()) @ nxt.T for k, v in y.items()}
        ids = {k: v.topk(c.num_experts_per_tok, dim=-1).indices.sort(-1).values for k, v in top.items()}
        same = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(ids["model"], ids["fp8"]))
        out[n] = {"block_rel_err_fp8_vs_bf16": round(_rel(y["fp8"], y["model"]), 5),
                  "next_router_choices_kept": round(same / ids["model"].numel(), 4)}
        print(f"block N={n}: {out[n]}", flush=True)
    del blocks
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--tokens", default="1,16,64,512,2048")
    args = ap.parse_args()
    tokens = [int(v) for v in args.tokens.split(",")]
    torch.manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
           "torch": torch.__version__, "command": " ".join(sys.argv), "tp": args.tp, "kernels": {}}
    ex = Experts(args.tp)
    for n in tokens:
        res["kernels"][n] = kernel_rows(ex, n)
        print(f"N={n}: {json.dumps(res['kernels'][n])}", flush=True)
    del ex
    torch.cuda.empty_cache()
    res["block"] = block_rows(args.tp, tokens)
    lines = ["| tokens | path | us | rel err vs fp32 |", "|---|---|---|---|"]
    for n, row in res["kernels"].items():
        for name, v in row.items():
            if isinstance(v, dict):
                lines.append(f"| {n} | {name} | {v['us']} | {v['rel_err_vs_fp32']} |")
    lines += ["", "| tokens | block rel err fp8 vs bf16 | next router choices kept |", "|---|---|---|"]
    lines += [f"| {n} | {v['block_rel_err_fp8_vs_bf16']} | {v['next_router_choices_kept']} |"
              for n, v in res["block"].items()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8_kernel_bench.json").write_text(json.dumps(res, indent=1))
    (out / "fp8_kernel_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
