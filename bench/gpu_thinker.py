"""The thinker's stages of the GPU component benchmark (bench/gpu_bench.py): one MoE decoder layer and an N-layer
stack per decode bucket (eager PyTorch, graphed PyTorch gather, eager/graphed Triton experts, the bytes-moved floor),
extrapolated to the full depth, and prefill of a prompt plus 1 s of audio. They write into the bench's results and
keep their medians in its `times` for the derived TTFA.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial

import torch
from gpu_timing import cuda_ms, param_bytes

from realtime_ming.engine.graphs import BucketedGraph, GraphInput
from realtime_ming.model import moe
from realtime_ming.model.kernels import select_kernels
from realtime_ming.model.thinker import Thinker, ThinkerKVCache

__all__ = ["BF16", "KV_CAP", "ThinkerStages"]

BF16 = torch.bfloat16
THINKER_BUCKETS = (1, 2, 4, 8, 16)
PROMPT_TOKENS, AUDIO_TOKENS = 40, 27  # ~40-token prompt + 1 s audio (25 audio tokens + 2 markers)
KV_CAP = 512


class ThinkerStages:
    """`decode` and `prefill` on `bench` (a `gpu_bench.Bench`): its args, results, kernel selection, TP shadow,
    model config, times, budget, copy bandwidth, device and dummy-weight builder."""

    def __init__(self, bench):
        self.args, self.res, self.kernels, self.tp = bench.args, bench.res, bench.kernels, bench.tp
        self.cfg, self.times, self.dev, self.build = bench.cfg, bench.times, bench.dev, bench.build
        self.over_budget, self._bandwidth = bench.over_budget, bench.bandwidth

    def thinker_inputs(self, thinker, b: int, t: int = 1, pos0: int = 200):
        d = thinker.cfg.hidden_size
        ids = torch.randint(0, thinker.cfg.vocab_size, (b, t), device=self.dev)
        cpos = (pos0 + torch.arange(t, device=self.dev)).expand(b, t).contiguous()
        return {"x": thinker.embed(ids).reshape(b, t, d), "pos3": cpos[None].expand(3, b, t).contiguous(),
                "cpos": cpos, "slots": torch.arange(b, device=self.dev)}

    def layer_fn(self, thinker, cache, layers: range, routing: list | None = None):
        """A thinker step restricted to `layers` (Thinker.forward's `layers`), no lm_head."""
        def step(x, pos3, cpos, slots):
            return thinker(x, pos3, cache=cache, slots=slots, cache_positions=cpos, kv_len=KV_CAP, routing=routing,
                           layers=layers)
        return step

    def stack_fn(self, thinker, cache):
        def step(x, pos3, cpos, slots):
            h = thinker(x, pos3, cache=cache, slots=slots, cache_positions=cpos, kv_len=KV_CAP)
            return thinker.logits(h[:, -1])
        return step

    def thinker_specs(self, d: int) -> dict:
        top = max(THINKER_BUCKETS)
        return {"x": GraphInput((top, 1, d), BF16), "pos3": GraphInput((3, top, 1), torch.int64, batch_dim=1),
                "cpos": GraphInput((top, 1), torch.int64, pad=-1), "slots": GraphInput((top,), torch.int64)}

    def floor_bytes(self, thinker, layers: range, inputs, lm_head: bool) -> int:
        """Fewest bytes a decode step must read: dense weights once, each used expert once, the KV read."""
        routing: list = []
        with torch.no_grad():  # rerun the layers eagerly to see which experts each layer picks
            self.layer_fn(thinker, self.cache, layers, routing)(**inputs)
        b = inputs["x"].shape[0]
        cfg = thinker.cfg
        local_inter = thinker.model.layers[cfg.first_k_dense_replace].mlp.experts_down.shape[-1]  # this rank's I
        per_expert = 3 * cfg.hidden_size * local_inter * 2
        skip = ("experts_gate_up", "experts_down", "image_gate", "audio_gate")
        total = sum(param_bytes(thinker.model.layers[i], skip=skip) for i in layers)
        total += sum(int(r.expert_ids.unique().numel()) * per_expert for r in routing)
        total += len(layers) * b * self.tp.divide(cfg.num_key_value_heads, 'kv heads') * cfg.resolved_head_dim * KV_CAP * 2 * 2
        if lm_head:
            total += param_bytes(thinker.lm_head) + param_bytes(thinker.model.norm)
        return total

    def decode_variants(self, thinker, fn, label: str) -> dict:
        """Per bucket: eager torch, graphed torch (gather forced), eager Triton, graphed Triton (ms)."""
        d = thinker.cfg.hidden_size
        out = {b: {} for b in THINKER_BUCKETS}
        # with the fused kernels on, decode batches take kernels.moe_decode's path whatever the experts'
        # selection says: only the Triton variants are distinct
        variants = ("eager_triton", "graph_triton") if self.kernels.on_device(self.dev) else (
            "eager_torch", "graph_torch_gather", "eager_triton", "graph_triton")
        for variant in variants:
            if self.over_budget(f"{label}/{variant}"):
                break
            triton_on = variant.endswith("triton")
            self.set_experts(thinker, triton_on)
            moe.GATHER_MAX_ROWS = 10 ** 9 if variant == "graph_torch_gather" else 16
            graph = None
            if variant.startswith("graph"):
                # own pool per variant: a pool must not outlive the graphs that were captured into it
                graph = BucketedGraph(fn, self.thinker_specs(d), THINKER_BUCKETS, device=self.dev)
                t = time.time()
                graph.capture()
                out.setdefault("capture_s", {})[variant] = round(time.time() - t, 2)
            for b in THINKER_BUCKETS:
                inp = self.thinker_inputs(thinker, b)
                call = partial(graph.step, **inp) if graph else partial(fn, **inp)
                with torch.no_grad():
                    out[b][variant] = cuda_ms(call, reps=self.args.reps)["median_ms"]
                print(f"  {label} {variant} B={b}: {out[b][variant]:.3f} ms", flush=True)
            del graph
            torch.cuda.empty_cache()
        self.set_experts(thinker, False)
        moe.GATHER_MAX_ROWS = 16
        return out

    def set_experts(self, model, on: bool) -> None:
        """Select the Triton MoE experts (or moe.py's PyTorch paths) for `model` (no effect without Triton)."""
        select_kernels(model, dataclasses.replace(self.kernels, moe_experts=on))

    def decode(self):
        n = self.args.thinker_layers
        tcfg = dataclasses.replace(self.cfg.thinker, num_hidden_layers=n)
        thinker = self.build(Thinker, tcfg, self.tp, kernels=self.kernels)
        self.cache = ThinkerKVCache.allocate(tcfg, max(THINKER_BUCKETS), KV_CAP, device=self.dev, dtype=BF16, tp=self.tp)
        self.thinker_model = thinker
        full_layers = self.cfg.thinker.num_hidden_layers
        # one MoE decoder layer (layer 1: attention + routed/shared experts)
        one = self.decode_variants(thinker, self.layer_fn(thinker, self.cache, range(1, 2)), "moe_layer")
        rows = []
        for b in THINKER_BUCKETS:
            fb = self.floor_bytes(thinker, range(1, 2), self.thinker_inputs(thinker, b), lm_head=False)
            one[b]["floor_ms"] = fb / self._bandwidth() * 1e3
            one[b]["floor_MB"] = fb / 1e6
            rows.append([b] + [one[b].get(k) for k in ("eager_torch", "graph_torch_gather", "eager_triton",
                                                       "graph_triton", "floor_ms")])
        self.res.stage("thinker_moe_layer_decode", one)
        self.res.table("Thinker: one MoE decoder layer, decode step (ms)",
                       ["B", "eager torch", "graph torch-gather", "eager triton", "graph triton", "floor"], rows)
        self.times["moe_layer"] = one
        # the N-layer stack with lm_head, extrapolated to the full depth
        stack = self.decode_variants(thinker, self.stack_fn(thinker, self.cache), f"stack{n}")
        rows = []
        for b in THINKER_BUCKETS:
            fb = self.floor_bytes(thinker, range(n), self.thinker_inputs(thinker, b), lm_head=True)
            stack[b]["floor_ms"] = fb / self._bandwidth() * 1e3
            extra = full_layers - n
            full = {k: stack[b][k] + extra * one[b][k] for k in stack[b] if k in one[b] and k != "floor_MB"}
            stack[b]["full32_est"] = full
            tps = 1e3 / full["graph_triton"] if "graph_triton" in full else None
            rows.append([b, stack[b].get("eager_torch"), stack[b].get("graph_triton"), stack[b]["floor_ms"],
                         full.get("eager_torch"), full.get("graph_triton"), full.get("floor_ms"), tps])
        self.res.stage("thinker_stack_decode", stack)
        self.res.table(f"Thinker decode step: {n}-layer stack + lm_head measured, 32 layers extrapolated "
                       f"(+{full_layers - n} × one MoE layer); "
                       + (f"one rank of TP={self.tp.size}, collectives skipped (ms)" if self.tp.shadow
                          else "single-GPU equivalent (ms)"),
                       ["B", f"eager torch ({n}L)", f"graph triton ({n}L)", f"floor ({n}L)", "eager torch (32L est)",
                        "graph triton (32L est)", "floor (32L est)", "tok/s per stream (graph triton)"], rows)
        self.times["stack"] = stack

    def prefill(self):
        thinker, n = self.thinker_model, self.args.thinker_layers
        t = PROMPT_TOKENS + AUDIO_TOKENS
        out = {}
        for b in (1, 16):
            inp = self.thinker_inputs(thinker, b, t=t, pos0=0)
            for variant in ("torch", "triton"):
                self.set_experts(thinker, variant == "triton")
                with torch.no_grad():
                    one = cuda_ms(partial(self.layer_fn(thinker, self.cache, range(1, 2)), **inp), reps=5)["median_ms"]
                    stack = cuda_ms(partial(self.stack_fn(thinker, self.cache), **inp), reps=5)["median_ms"]
                out[f"B{b}_{variant}"] = {"one_moe_layer_ms": one, f"stack{n}_ms": stack,
                                          "full32_est_ms": stack + (self.cfg.thinker.num_hidden_layers - n) * one}
                print(f"  prefill B={b} T={t} {variant}: {out[f'B{b}_{variant}']}", flush=True)
        self.set_experts(thinker, False)
        self.res.stage("thinker_prefill", out)
        self.res.table(f"Thinker prefill, {t} tokens per stream ({PROMPT_TOKENS} prompt + 1 s audio) (ms)",
                       ["case", "one MoE layer", f"{n}-layer stack", "32 layers est"],
                       [[k, v["one_moe_layer_ms"], v[f"stack{n}_ms"], v["full32_est_ms"]] for k, v in out.items()])
        self.times["prefill"] = out
        del self.thinker_model, self.cache
        torch.cuda.empty_cache()
