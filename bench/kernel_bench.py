"""Per-kernel timings of a thinker decode layer at the real Ming-flash-omni-2.0 shapes (one GPU).

    python bench/kernel_bench.py --out DIR [--tp 2] [--batches 1,16] [--tune] [--prefill] [--live 0.75]
        [--selection 16,24,64,512]

Each op runs 50 times inside one CUDA graph (launch gaps as in the graphed decode step); the median
per call over 10 replays is reported with the bytes it must move and the bandwidth that implies.
Shapes are one rank of TP=--tp (heads, KV heads, expert width and vocabulary divided). `--tune`
sweeps the MoE decode kernels' block sizes and warps (90 compiles per batch: several minutes;
`--tune-batches 1` limits it), printing each setting as it goes and the fastest per batch at the end.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from realtime_ming.model import moe  # noqa: E402
from realtime_ming.model.kernels import TRITON  # noqa: E402
from realtime_ming.model.kernels import moe_decode as md  # noqa: E402
from realtime_ming.model.kernels import slot_attention as sa  # noqa: E402
from realtime_ming.model.kernels.norm import add_rms_norm  # noqa: E402
from realtime_ming.model.kernels.rotary import RotaryStyle, head_rotary  # noqa: E402
from realtime_ming.model.presets import preset_config  # noqa: E402

DEV, BF16 = "cuda", torch.bfloat16
K = TRITON  # every kernel timed is the Triton one (its reference where noted)


def graphed_us(fn, calls: int = 50, replays: int = 10) -> float:
    """Median µs per call of `fn` captured `calls` times in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def _w(*shape, scale=None):
    t = torch.randn(*shape, device=DEV, dtype=torch.float32)
    return (t * (scale if scale is not None else shape[-1] ** -0.5)).to(BF16)


class Layer:
    """One rank's tensors of one MoE decode layer (random, bf16) and a batch of decode inputs."""

    def __init__(self, tp: int, batch: int, kv_len: int, live: float):
        c = preset_config("ming-flash-omni-2.0").thinker
        self.c, self.b = c, batch
        d, hd = c.hidden_size, c.resolved_head_dim
        self.h, self.kv = c.num_attention_heads // tp, c.num_key_value_heads // tp
        self.inter = c.moe_intermediate_size // tp
        self.hd, self.d = hd, d
        self.x = _w(batch, 1, d, scale=1.0)
        self.norm_w = 1 + 0.1 * _w(d, scale=1.0)
        self.w_qkv = _w((self.h + 2 * self.kv) * hd, d)
        self.q_norm, self.k_norm = 1 + 0.1 * _w(hd, scale=1.0), 1 + 0.1 * _w(hd, scale=1.0)
        self.w_dense = _w(d, self.h * hd)
        slots = 32
        self.kc = _w(slots, self.kv, 4097, hd, scale=1.0)
        self.vc = _w(slots, self.kv, 4097, hd, scale=1.0)
        self.slots = torch.arange(batch, device=DEV)
        self.pos = torch.full((batch, 1), kv_len - 1, device=DEV)
        self.lengths = self.pos[:, 0] + 1
        rd = int(hd * c.partial_rotary_factor)
        ang = torch.rand(batch, 1, 1, rd, device=DEV)
        self.cos, self.sin = ang.cos().to(BF16), ang.sin().to(BF16)
        self.gate = _w(c.num_experts, d)
        self.bias = (0.05 * torch.randn(c.num_experts, device=DEV)).to(BF16)
        self.w_gu = _w(c.num_experts, 2 * self.inter, d)
        self.w_dn = _w(c.num_experts, d, self.inter)
        self.sg, self.su, self.sd = _w(self.inter, d), _w(self.inter, d), _w(d, self.inter)
        self.lm = _w(c.vocab_size // tp, d)
        self.flat = self.x[:, 0]
        self.ids, self.weights = md.route(self.flat, self.gate, self.bias, c.num_experts_per_tok, c.n_group,
                                          c.topk_group, c.routed_scaling_factor, kernels=K)
        # a bucket's padding: the last rows not live (the decode kernels skip them)
        self.n_live = max(1, math.ceil(batch * live))
        self.live = torch.arange(batch, device=DEV) < self.n_live

    def ops(self) -> dict:
        """name -> (callable, bytes it must move)."""
        b, d, hd, e2 = self.b, self.d, self.hd, 2
        qkv = F.linear(self.x, self.w_qkv)
        attn_in = torch.randn(b, self.h, 1, hd, device=DEV, dtype=BF16)
        out_flat = torch.randn(b, 1, self.h * hd, device=DEV, dtype=BF16)
        k = self.c.num_experts_per_tok
        experts = len(set(self.ids.flatten().tolist()))
        moe_bytes = (experts + 1) * 3 * d * self.inter * e2
        live_bytes = (len(set(self.ids[:self.n_live].flatten().tolist())) + 1) * 3 * d * self.inter * e2
        kv_bytes = b * self.kv * int(self.lengths[0]) * hd * e2 * 2
        return {
            "add_rms_norm": (lambda: add_rms_norm(self.x, self.x, self.norm_w, 1e-6, kernels=K), 3 * b * d * e2),
            "qkv_gemm": (lambda: F.linear(self.x, self.w_qkv), self.w_qkv.numel() * e2),
            "head_rotary+cache": (lambda: head_rotary(
                qkv, self.h, self.kv, hd, self.cos, self.sin, RotaryStyle.NEOX_ROUND_EACH, q_norm=self.q_norm,
                k_norm=self.k_norm, k_out=self.kc, v_out=self.vc, rows=self.slots, index=self.pos, kernels=K),
                qkv.numel() * e2 * 2),
            "decode_attention": (lambda: sa.decode_attention(attn_in, self.kc, self.vc, self.slots, self.lengths, kernels=K),
                                 kv_bytes),
            "dense_gemm": (lambda: F.linear(out_flat, self.w_dense), self.w_dense.numel() * e2),
            "route": (lambda: md.route(self.flat, self.gate, self.bias, k, self.c.n_group, self.c.topk_group,
                                       self.c.routed_scaling_factor, kernels=K), self.gate.numel() * e2),
            "moe_decode": (lambda: md.moe_decode(self.flat, self.ids, self.weights, self.w_gu, self.w_dn, self.sg,
                                                 self.su, self.sd, kernels=K), moe_bytes),
            f"moe_decode_live{self.n_live}": (lambda: md.moe_decode(
                self.flat, self.ids, self.weights, self.w_gu, self.w_dn, self.sg, self.su, self.sd, kernels=K,
                live=self.live), live_bytes),
            "lm_head_gemm": (lambda: F.linear(self.flat, self.lm), self.lm.numel() * e2),
        }


def prefill_attention_cases(layer: Layer) -> dict:
    """The prefill attention kernel vs the path it replaced (slots gathered up to the cache capacity,
    grouped K/V expanded, a mask, SDPA) for chunks of rows x width tokens starting at a cache index."""
    res = {}
    for rows, width, start in ((1, 128, 0), (4, 128, 0), (1, 512, 0), (4, 96, 1000)):
        q = torch.randn(rows, layer.h, width, layer.hd, device=DEV, dtype=BF16)
        slots = torch.arange(rows, device=DEV)
        lengths = (start + torch.arange(width, device=DEV) + 1).expand(rows, width).contiguous()
        got = sa.prefill_attention(q, layer.kc, layer.vc, slots, lengths, kernels=K)
        ref = sa.prefill_attention_reference(q, layer.kc, layer.vc, slots, lengths)
        err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
        new_us = graphed_us(lambda: sa.prefill_attention(q, layer.kc, layer.vc, slots, lengths, kernels=K), calls=20)
        old_us = graphed_us(lambda: sa.prefill_attention_reference(q, layer.kc, layer.vc, slots, lengths), calls=20)
        key = f"{rows}x{width}@{start}"
        res[key] = {"kernel_us": round(new_us, 2), "replaced_us": round(old_us, 2), "rel_err": round(err, 5)}
        print(f"prefill attention {key:12s} kernel {new_us:8.2f} us  replaced path {old_us:8.2f} us  "
              f"rel err {err:.2e}", flush=True)
    return res


def check_route(layer: Layer) -> dict:
    """The router kernel vs moe.select_experts on the same inputs: mismatching tokens, logits error."""
    c = layer.c
    x = _w(16, layer.d, scale=1.0)
    ids, w = md.route(x, layer.gate, layer.bias, c.num_experts_per_tok, c.n_group, c.topk_group,
                      c.routed_scaling_factor, kernels=K)
    logits = F.linear(x.float(), layer.gate.float())
    ref_ids, ref_w = moe.select_experts(logits, layer.bias, c.num_experts_per_tok, c.n_group, c.topk_group,
                                        c.routed_scaling_factor)
    bad = [i for i in range(16) if sorted(ids[i].tolist()) != sorted(ref_ids[i].tolist())]
    got_w = w.gather(1, ids.sort(dim=-1).indices)
    want_w = ref_w.gather(1, ref_ids.sort(dim=-1).indices)
    out = {"tokens_mismatching": bad, "weights_max_abs_err": float((got_w - want_w).abs().max())}
    if bad:
        i = bad[0]
        out["example"] = {"kernel": sorted(ids[i].tolist()), "reference": sorted(ref_ids[i].tolist())}
    return out


def tune_moe(layer: Layer) -> list:
    rows = []
    for gu_n, gu_k, gu_w in itertools.product((2, 4, 8, 16, 32), (256, 512, 1024), (1, 2, 4)):
        t = {"gu_n": gu_n, "gu_k": gu_k, "gu_warps": gu_w}
        try:
            us = graphed_us(lambda: md.moe_decode(layer.flat, layer.ids, layer.weights, layer.w_gu, layer.w_dn,
                                                  layer.sg, layer.su, layer.sd, kernels=K, tune=t))
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is skipped
            us = float("nan")
            print("  skip", t, type(exc).__name__)
        rows.append(("gate_up", t, us))
        print(f"  gate_up {t}: {us:.2f} us", flush=True)
    best_gu = min((r for r in rows if r[2] == r[2]), key=lambda r: r[2])[1]
    for dn_d, dn_k, dn_w in itertools.product((2, 4, 8, 16, 32), (128, 256, 512), (1, 2, 4)):
        t = {**best_gu, "dn_d": dn_d, "dn_k": dn_k, "dn_warps": dn_w}
        try:
            us = graphed_us(lambda: md.moe_decode(layer.flat, layer.ids, layer.weights, layer.w_gu, layer.w_dn,
                                                  layer.sg, layer.su, layer.sd, kernels=K, tune=t))
        except Exception as exc:  # noqa: BLE001
            us = float("nan")
            print("  skip", t, type(exc).__name__)
        rows.append(("down", t, us))
        print(f"  down {t}: {us:.2f} us", flush=True)
    return rows


def selection_cases(layer: Layer, tokens: list[int]) -> dict:
    """A MoE layer's routing of N tokens, µs per layer: the reference (fp32 router GEMM + `moe.select_experts`,
    what a decode batch above MAX_DECODE_TOKENS and every chunk ran before 2026-11-27), the GEMM + the selection
    kernel (`moe_decode.select`, what they run now), and the fused router (`moe_decode.route`, up to
    MAX_DECODE_TOKENS tokens)."""
    c = layer.c
    args = (c.num_experts_per_tok, c.n_group, c.topk_group, c.routed_scaling_factor)
    out = {}
    for n in tokens:
        x = _w(n, layer.d, scale=1.0)
        row = {
            "reference": graphed_us(lambda: moe.select_experts(F.linear(x.float(), layer.gate.float()), layer.bias,
                                                               *args)),
            "gemm+select_kernel": graphed_us(lambda: md.select(F.linear(x.float(), layer.gate.float()), layer.bias,
                                                               *args, kernels=K)),
        }
        if n <= md.MAX_DECODE_TOKENS:
            row["route_kernel"] = graphed_us(lambda: md.route(x, layer.gate, layer.bias, *args, kernels=K))
        out[n] = {k: round(v, 2) for k, v in row.items()}
        print(f"selection N={n}: " + ", ".join(f"{k} {v:.2f} us" for k, v in out[n].items()), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--kv-len", type=int, default=300)
    ap.add_argument("--tune", action="store_true", help="also sweep the MoE decode kernels' tile sizes (72 compiles "
                    "per batch, minutes)")
    ap.add_argument("--prefill", action="store_true", help="also time the prefill attention kernel against the "
                    "gathered, masked SDPA path it replaced")
    ap.add_argument("--tune-batches", default=None, help="batches to tune (default: all of --batches)")
    ap.add_argument("--selection", default=None, help="also time a layer's routing of these token counts "
                    "(e.g. 16,24,64,512): reference vs the selection kernel")
    ap.add_argument("--live", type=float, default=0.75, help="moe_decode_liveN: the experts with only this share "
                    "of a batch's rows live (the rest a graph bucket's padding, skipped)")
    args = ap.parse_args()
    out = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
           "torch": torch.__version__, "command": " ".join(sys.argv), "tp": args.tp, "kv_len": args.kv_len,
           "batches": {}}
    torch.manual_seed(0)
    for b in (int(v) for v in args.batches.split(",")):
        layer = Layer(args.tp, b, args.kv_len, args.live)
        res = {}
        for name, (fn, nbytes) in layer.ops().items():
            us = graphed_us(fn)
            res[name] = {"us": round(us, 2), "MB": round(nbytes / 1e6, 2), "GBps": round(nbytes / us / 1e3, 1)}
            print(f"B={b} {name:20s} {us:8.2f} us  {nbytes / 1e6:8.2f} MB  {nbytes / us / 1e3:7.1f} GB/s", flush=True)
        if args.prefill:
            res["prefill_attention"] = prefill_attention_cases(layer)
        res["route_check"] = check_route(layer)
        print("route check:", res["route_check"], flush=True)
        if args.tune and (args.tune_batches is None or str(b) in args.tune_batches.split(",")):
            rows = tune_moe(layer)
            res["moe_tune"] = [{"part": p, **t, "us": round(us, 2)} for p, t, us in rows]
            for part in ("gate_up", "down"):
                best = sorted((r for r in rows if r[0] == part and r[2] == r[2]), key=lambda r: r[2])[:3]
                print(f"B={b} best {part}:", [(t, round(us, 2)) for _, t, us in best], flush=True)
        if args.selection and b == int(args.batches.split(",")[0]):
            out["selection"] = selection_cases(layer, [int(v) for v in args.selection.split(",")])
        out["batches"][b] = res
        del layer
        torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "kernel_bench.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
