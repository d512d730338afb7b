"""GPU component benchmark at the real Ming-flash-omni-2.0 shapes with dummy weights (issue 4).

    python bench/gpu_bench.py --out DIR [--thinker-layers 5] [--budget-s 420]

Stages (each writes its numbers before the next starts; stages past --budget-s are skipped):
thinker one MoE layer and an N-layer stack per decode bucket (eager PyTorch, graphed PyTorch
gather, eager/graphed Triton experts, the bytes-moved floor) extrapolated to 32 layers; thinker
prefill (40-token prompt + 1 s of audio); talker `decode_lm` and `tail_step` graphed per bucket
and RTF; streaming VAE `decode_chunk` graphed; the talker serving rate (req/s and RTF at c=1..16,
DERIVED from the graphed talker step + VAE chunk); audio / vision encoders; a DERIVED TTFA_server
estimate for c=1 and c=16 composed from the component times (not an end-to-end measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_thinker import BF16, KV_CAP, ThinkerStages
from gpu_timing import Results, cuda_ms, measure_ceilings

from realtime_ming.engine.graphs import BucketedGraph, GraphInput
from realtime_ming.model.kernels import Kernels, available
from realtime_ming.model.audio_encoder import AudioProjector, WhisperEncoder
from realtime_ming.model.cfm import CFMParams, sway_time_grid
from realtime_ming.model.layers import TPGroup
from realtime_ming.model.loader import init_dummy
from realtime_ming.model.presets import preset_config
from realtime_ming.model.qwen2 import KVCache
from realtime_ming.model.talker import Talker
from realtime_ming.model.vae import AudioVAE
from realtime_ming.model.vae_stream import VAEStreamState, decode_chunk
from realtime_ming.model.vision import VisionProjector, VisionTransformer

TALKER_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
STEP_AUDIO_S = 0.32  # one talker step = 4 VAE latents × 80 ms = one VAE chunk
REPLY_STEPS = 19  # a ~6 s spoken reply: 19 talker steps × 0.32 s = 6.08 s of audio
THROUGHPUT_LEVELS = (1, 2, 4, 8, 16)  # concurrency levels of the talker serving-rate table
DEV = "cuda"  # --dry-cpu: "cpu" with the tiny preset (plumbing check, eager only)


def build(cls, *args, seed=0, kernels: Kernels | None = None):
    """Construct on meta (with `kernels`, for the models that take a selection) and fill with seeded dummy
    bf16 weights on the device."""
    with torch.device("meta"):
        module = cls(*args) if kernels is None else cls(*args, kernels=kernels)
    return init_dummy(module, seed=seed, device=DEV, dtype=BF16).eval()


def bench_config(dry: bool):
    if not dry:
        return preset_config("ming-flash-omni-2.0")
    from realtime_ming.model.presets import tiny_config
    from realtime_ming.model.tiny_tokenizer import (
        TINY_VOCAB_SIZE,
        tiny_talker_special_ids,
        tiny_thinker_special_ids,
    )

    return tiny_config(tiny_thinker_special_ids(), tiny_talker_special_ids(), TINY_VOCAB_SIZE)


def talker_throughput(talker: dict, vae: dict, levels: tuple[int, ...] = THROUGHPUT_LEVELS,
                      reply_steps: int = REPLY_STEPS) -> dict:
    """Talker serving rate per concurrency c, DERIVED from per-bucket medians (ms).

    `talker[c]["step_ms"]` (graphed decode_lm + tail_step) and `vae[c]["graph_ms"]` (graphed chunk)
    at batch c. All c streams step in lockstep: one batch step = talker step + VAE chunk and gives
    each stream 0.32 s of audio, so c replies of `reply_steps` steps finish together after
    reply_steps × batch step: req/s = c / that. RTF per stream = batch step / 0.32 s (< 1 keeps up
    with playback). Talker prefill and the thinker are not counted. Levels lacking either time are
    left out. Returns {c: {talker_step_ms, vae_chunk_ms, batch_step_ms, rtf_per_stream, reply_s, req_per_s}}.
    """
    out = {}
    for c in levels:
        if c not in talker or c not in vae:
            continue
        step_ms = talker[c]["step_ms"] + vae[c]["graph_ms"]
        reply_s = reply_steps * step_ms / 1e3
        out[c] = {"talker_step_ms": talker[c]["step_ms"], "vae_chunk_ms": vae[c]["graph_ms"],
                  "batch_step_ms": step_ms, "rtf_per_stream": step_ms / 1e3 / STEP_AUDIO_S,
                  "reply_s": reply_s, "req_per_s": c / reply_s}
    return out


class Bench:
    def __init__(self, args):
        self.args = args
        self.cfg = bench_config(args.dry_cpu)
        name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run, tiny preset)"
        meta = {"device": name, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
                "python": platform.python_version(), "command": " ".join(sys.argv),
                "weights": "dummy (loader.init_dummy, seeded), bf16",
                "thinker_layers_built": args.thinker_layers,
                "fused_kernels": not args.no_fused,
                "thinker_tp_shadow": args.tp_shadow}
        self.res = Results(Path(args.out), meta)
        # the serving engine's selection (`--no-fused`: the reference ops, the Triton MoE experts kept)
        self.kernels = Kernels(triton=not args.no_fused, moe_experts=True)
        self.t0 = time.time()
        self.bw = None
        self.times: dict = {}
        self.talker_buckets = tuple(sorted(args.talker_buckets))
        # the thinker as rank 0 of TP=N alone on this GPU, collectives skipped: one rank's compute
        self.tp = TPGroup(0, args.tp_shadow, shadow=True) if args.tp_shadow > 1 else TPGroup()
        self.dev = DEV
        self.thinker_stages = ThinkerStages(self)

    def build(self, cls, *args, **kwargs):
        """`build` (dummy weights on this run's device), for the stages kept in other files."""
        return build(cls, *args, **kwargs)

    def over_budget(self, stage: str) -> bool:
        spent = time.time() - self.t0
        if spent > self.args.budget_s:
            self.res.note(f"stage {stage} skipped: {spent:.0f} s spent > budget {self.args.budget_s} s")
            return True
        print(f"== {stage} (t={spent:.0f} s)", flush=True)
        return False

    # ---- ceilings ----------------------------------------------------------------------------

    def bandwidth(self) -> float:
        """Copy bandwidth in B/s for the byte floors (measured by the ceilings stage, or now when it was not run)."""
        if self.bw is None:
            self.ceilings()
        return self.bw

    def ceilings(self):
        c = measure_ceilings(DEV)
        self.bw = c["copy_GBps"] * 1e9
        self.res.stage("ceilings", c)
        print(c, flush=True)

    # ---- thinker (bench/gpu_thinker.py) ----------------------------------------------------------

    def thinker(self):
        self.thinker_stages.decode()

    def thinker_prefill(self):
        self.thinker_stages.prefill()

    # ---- talker ------------------------------------------------------------------------------

    def talker(self):
        tc = self.cfg.talker
        talker = build(Talker, tc, seed=1, kernels=self.kernels)
        top = max(self.talker_buckets)
        h, c, p, s, hh = talker.hidden_size, talker.latent_dim, tc.patch_size, tc.steps, tc.history_patch_size
        cache = KVCache.allocate(tc.llm, top, KV_CAP, DEV, BF16)
        t_grid = sway_time_grid(s, BF16, DEV)

        def lm(e, pos):
            return talker.decode_lm(e, pos, cache.rows(0, e.shape[0]))

        def tail(h_, his, y0, rnd, sde):
            return talker.tail_step(h_, his, y0, rnd, t_grid, sde)

        pool = (torch.cuda.graph_pool_handle() if DEV == "cuda" else None)
        g_lm = BucketedGraph(lm, {"e": GraphInput((top, 1, h), BF16), "pos": GraphInput((top, 1), torch.int64, pad=-1)},
                             self.talker_buckets, device=DEV, pool=pool)
        g_tail = BucketedGraph(tail, {"h_": GraphInput((top, 1, h), BF16), "his": GraphInput((top, hh, c), BF16),
                                      "y0": GraphInput((top, p, c), BF16),
                                      "rnd": GraphInput((s, top, p, c), BF16, batch_dim=1),
                                      "sde": GraphInput((top, 3), BF16)}, self.talker_buckets, device=DEV, pool=pool)
        t = time.time()
        g_lm.capture()
        g_tail.capture()
        capture_s = time.time() - t

        def inputs(b):
            sde = CFMParams().tensor(DEV, BF16).expand(b, 3).contiguous()
            return ({"e": torch.randn(b, 1, h, device=DEV, dtype=BF16), "pos": torch.full((b, 1), 100, device=DEV)},
                    {"h_": torch.randn(b, 1, h, device=DEV, dtype=BF16),
                     "his": torch.randn(b, hh, c, device=DEV, dtype=BF16),
                     "y0": torch.randn(b, p, c, device=DEV, dtype=BF16),
                     "rnd": torch.randn(s, b, p, c, device=DEV, dtype=BF16), "sde": sde})

        out, rows = {"capture_s": round(capture_s, 2)}, []
        with torch.no_grad():
            li, ti = inputs(1)
            out["eager_B1"] = {"decode_lm_ms": cuda_ms(lambda: lm(**li), reps=5)["median_ms"],
                               "tail_step_ms": cuda_ms(lambda: tail(**ti), reps=3, warmup=1)["median_ms"]}
            for b in self.talker_buckets:
                li, ti = inputs(b)
                r = {"decode_lm_ms": cuda_ms(partial(g_lm.step, **li), reps=self.args.reps)["median_ms"],
                     "tail_step_ms": cuda_ms(partial(g_tail.step, **ti), reps=self.args.reps)["median_ms"]}
                r["step_ms"] = r["decode_lm_ms"] + r["tail_step_ms"]
                r["rtf_per_stream"] = r["step_ms"] / 1e3 / STEP_AUDIO_S
                r["audio_s_per_s"] = b * STEP_AUDIO_S / (r["step_ms"] / 1e3)
                out[b] = r
                rows.append([b, r["decode_lm_ms"], r["tail_step_ms"], r["step_ms"], r["rtf_per_stream"], r["audio_s_per_s"]])
                print(f"  talker B={b}: {r}", flush=True)
            for b in (b for b in (1, 16) if b <= top):  # talker prefill (~64-token prompt), eager
                e = torch.randn(b, 64, h, device=DEV, dtype=BF16)
                pos = torch.arange(64, device=DEV).expand(b, 64)
                out[f"prefill_B{b}_ms"] = cuda_ms(partial(talker.prefill, e, pos, cache.rows(0, b)), reps=5)["median_ms"]
        rows.insert(0, ["1 (eager)", out["eager_B1"]["decode_lm_ms"], out["eager_B1"]["tail_step_ms"],
                        sum(out["eager_B1"].values()), sum(out["eager_B1"].values()) / 1e3 / STEP_AUDIO_S, None])
        self.res.stage("talker", out)
        self.res.table("Talker step per bucket, CUDA graphs (decode_lm + tail_step = CFM 10 steps CFG + aggregator + "
                       "stop head); one step = 0.32 s audio per stream",
                       ["B", "decode_lm ms", "tail_step ms", "step ms", "RTF per stream", "audio s / s"], rows)
        self.times["talker"] = out
        self.talker_model, self.talker_pool = talker, pool
        self._talker_graphs = (g_lm, g_tail, tail, inputs)

    def talker_profile(self):
        """Kernel view of the graphed talker step at B=1 (and the tail at the largest bucket; torch.profiler over
        replays, then over eager calls at B=1):
        kernels per step, the GPU time they add up to vs the step's time, and the kernels with the most time."""
        g_lm, g_tail, _, inputs = self._talker_graphs
        eager = {"decode_lm": self._talker_graphs[0].fn, "tail_step": self._talker_graphs[2]}
        out, reps = {}, 5
        gpu = DEV == "cuda"  # --dry-cpu: the CPU ops stand in for kernels
        activity = torch.profiler.ProfilerActivity.CUDA if gpu else torch.profiler.ProfilerActivity.CPU
        own = (lambda e: e.self_device_time_total) if gpu else (lambda e: e.self_cpu_time_total)
        with torch.no_grad():
            top = max(self.talker_buckets)
            for name, graph, which, b in (("decode_lm", g_lm, 0, 1), ("tail_step", g_tail, 1, 1),
                                          ("tail_step", g_tail, 1, top)):
                ins = inputs(b)[which]
                modes = (("graphed", partial(graph.step, **ins)), ("eager", partial(eager[name], **ins)))
                for mode, fn in modes if b == 1 else modes[:1]:
                    step_ms = cuda_ms(fn, reps=reps)["median_ms"]
                    with torch.profiler.profile(activities=[activity]) as prof:
                        for _ in range(reps):
                            fn()
                        if gpu:
                            torch.cuda.synchronize()
                    ka = [e for e in prof.key_averages() if own(e) > 0]
                    r = {"step_ms": round(step_ms, 3),
                         "kernels_per_step": round(sum(e.count for e in ka) / reps, 1),
                         "gpu_busy_ms_per_step": round(sum(own(e) for e in ka) / reps / 1e3, 3),
                         "top": [[e.key[:90], round(e.count / reps, 1), round(own(e) / reps / 1e3, 4)]
                                 for e in sorted(ka, key=lambda e: -own(e))[:25]]}
                    out[f"{name}/B{b}/{mode}"] = r
                    print(f"  talker profile {name} B={b} {mode}: step {r['step_ms']} ms, {r['kernels_per_step']} kernels, "
                          f"GPU busy {r['gpu_busy_ms_per_step']} ms", flush=True)
        self.res.stage("talker_profile", out)
        for key, r in out.items():
            self.res.table(f"Talker {key}: {r['kernels_per_step']} kernels per step, GPU busy "
                           f"{r['gpu_busy_ms_per_step']} ms of a {r['step_ms']} ms step; kernels with the most time "
                           "(per step)", ["kernel", "calls", "ms"], r["top"])

    def talker_compiled(self):
        """Optional: leaf modules through torch.compile (Inductor fuses norms/rotary/GELU), graphed at B=1/16.

        Cumulative: (a) the CFM DiT blocks, (b) + the aggregator blocks, (c) the talker-LM layers.
        """
        talker = self.talker_model
        g_lm, g_tail, _, inputs = self._talker_graphs
        out = {}

        def small(graph):  # the same step, buckets 1 and 16 only
            specs = {n: dataclasses.replace(sp, shape=tuple(16 if i == sp.batch_dim else v for i, v in enumerate(sp.shape)))
                     for n, sp in graph.specs.items()}
            return BucketedGraph(graph.fn, specs, (1, 16), device=DEV, pool=self.talker_pool)

        steps = (("dit_blocks", talker.cfm.model.blocks, g_tail, 1),
                 ("dit_and_aggregator_blocks", talker.aggregator.blocks, g_tail, 1),
                 ("lm_layers", talker.model.layers, g_lm, 0))
        for name, blocks, graph, which in steps:
            if self.over_budget(f"talker_compiled/{name}"):
                break
            for blk in blocks:
                blk.forward = torch.compile(blk.forward, dynamic=False)
            g = small(graph)
            t = time.time()
            g.capture()
            r = {"compile_and_capture_s": round(time.time() - t, 1)}
            with torch.no_grad():
                for b in (1, 16):
                    ins = inputs(b)[which]
                    r[f"B{b}_ms"] = cuda_ms(partial(g.step, **ins), reps=self.args.reps)["median_ms"]
            out[name] = r
            print(f"  compiled {name}: {r}", flush=True)
        self.res.stage("talker_compiled", out)
        base = self.times["talker"]
        self.res.table("Talker with torch.compile'd leaf modules, CUDA graphs (ms; cumulative)",
                       ["what", "B=1", "B=16", "graph without compile B=1", "B=16"],
                       [[k, v["B1_ms"], v["B16_ms"], base[1]["decode_lm_ms" if k == "lm_layers" else "tail_step_ms"],
                         base[16]["decode_lm_ms" if k == "lm_layers" else "tail_step_ms"]] for k, v in out.items()])

    # ---- VAE -----------------------------------------------------------------------------------

    def vae(self):
        vae = build(AudioVAE, self.cfg.vae, seed=2, kernels=self.kernels)
        top = max(self.talker_buckets)
        st = VAEStreamState.allocate(vae, top, chunk_latents=4)
        c = self.cfg.vae.dec_kwargs.latent_dim

        def rows(b):
            return VAEStreamState(st.chunk_latents, st.cache.rows(0, b), st.held[:b], st.left_ctx[:b],
                                  st.has_held[:b], st.frame_pos[:b], st.audio_buf[:b], st.env_buf[:b])

        def chunk(lat, last, active):
            out = decode_chunk(vae, lat, rows(lat.shape[0]), last, active)
            return out.audio, out.num_samples

        g = BucketedGraph(chunk, {"lat": GraphInput((top, 4, c), BF16), "last": GraphInput((top,), torch.bool),
                                  "active": GraphInput((top,), torch.bool)}, self.talker_buckets, device=DEV)
        g.capture()
        out, table = {}, []
        with torch.no_grad():
            for b in self.talker_buckets:
                inp = {"lat": torch.randn(b, 4, c, device=DEV, dtype=BF16),
                       "last": torch.zeros(b, dtype=torch.bool, device=DEV),
                       "active": torch.ones(b, dtype=torch.bool, device=DEV)}
                r = {"graph_ms": cuda_ms(partial(g.step, **inp), reps=self.args.reps)["median_ms"]}
                if b in (1, 16):
                    r["eager_ms"] = cuda_ms(partial(chunk, **inp), reps=5)["median_ms"]
                out[b] = r
                table.append([b, r.get("eager_ms"), r["graph_ms"]])
        self.res.stage("vae_decode_chunk", out)
        self.res.table("AudioVAE streaming decode_chunk (4 latents = 0.32 s per stream) (ms)",
                       ["B", "eager", "graph"], table)
        self.times["vae"] = out

    def talker_throughput(self):
        """Talker req/s and RTF at c = 1..16 from the talker and VAE stages' graphed medians (DERIVED)."""
        if "talker" not in self.times or "vae" not in self.times:
            self.res.note("stage talker_throughput skipped: needs the talker and vae stages")
            return
        out = talker_throughput(self.times["talker"], self.times["vae"])
        self.res.stage("talker_throughput_derived", {"reply_steps": REPLY_STEPS, "levels": out})
        self.res.table(f"Talker serving rate, DERIVED: all c streams in lockstep, batch step = graphed talker step "
                       f"+ VAE chunk (0.32 s audio per stream); a reply = {REPLY_STEPS} steps "
                       f"({REPLY_STEPS * STEP_AUDIO_S:.2f} s); no talker prefill, no thinker",
                       ["c", "talker step ms", "VAE chunk ms", "batch step ms", "RTF per stream", "reply wall s",
                        "req/s"],
                       [[c, r["talker_step_ms"], r["vae_chunk_ms"], r["batch_step_ms"], r["rtf_per_stream"],
                         r["reply_s"], r["req_per_s"]] for c, r in out.items()])

    # ---- encoders ----------------------------------------------------------------------------

    def encoders(self):
        ac, vc, d = self.cfg.ming.audio_config, self.cfg.ming.vision_config, self.cfg.thinker.hidden_size
        whisper, proj = build(WhisperEncoder, ac, seed=3), build(AudioProjector, ac, d, seed=4)
        n_mels = ac.whisper_encoder_config.n_mels

        def audio(mel):
            return proj(whisper(mel))

        g = BucketedGraph(audio, {"mel": GraphInput((16, 100, n_mels), BF16)}, (1, 16), device=DEV)
        g.capture()
        out = {}
        with torch.no_grad():
            for b in (1, 16):
                mel = torch.randn(b, 100, n_mels, device=DEV, dtype=BF16)
                out[f"audio_1s_B{b}"] = {"eager_ms": cuda_ms(partial(audio, mel), reps=5)["median_ms"],
                                         "graph_ms": cuda_ms(partial(g.step, mel=mel), reps=self.args.reps)["median_ms"]}
            vit, vproj = build(VisionTransformer, vc, seed=5), build(VisionProjector, vc, d, seed=6)
            side = 28  # 448 × 448 image: 28 × 28 patches of 16 → 196 merged tokens
            patch_dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
            pix = torch.randn(side * side, patch_dim, device=DEV, dtype=BF16)
            out["image_448_eager_ms"] = cuda_ms(lambda: vproj(vit(pix, [(1, side, side)])), reps=5)["median_ms"]
        self.res.stage("encoders", out)
        self.res.table("Encoders (ms)", ["input", "eager", "graph"],
                       [[k, v["eager_ms"], v["graph_ms"]] for k, v in out.items() if isinstance(v, dict)]
                       + [["image 448×448 (196 tokens)", out["image_448_eager_ms"], None]])
        self.times["encoders"] = out

    # ---- derived TTFA ------------------------------------------------------------------------

    def derived_ttfa(self):
        """TTFA_server composed from component medians (DERIVED, not measured end to end)."""
        tm = self.times
        rows, out = [], {}
        for c in (1, 16):
            key = 1 if c == 1 else 16
            parts = {
                "audio_encoder": tm["encoders"][f"audio_1s_B{key}"]["graph_ms"],
                "thinker_prefill_32L": tm["prefill"][f"B{key}_triton"]["full32_est_ms"],
                f"thinker_decode_{self.args.segment_tokens}_tokens_32L":
                    self.args.segment_tokens * tm["stack"][key]["full32_est"]["graph_triton"],
                "talker_prefill": tm["talker"][f"prefill_B{key}_ms"],
                "talker_2_steps": 2 * tm["talker"][key]["step_ms"],
                "vae_2_chunks": 2 * tm["vae"][key]["graph_ms"],
            }
            total = sum(parts.values())
            out[c] = {"parts_ms": parts, "total_ms": total}
            rows += [[f"c={c}", k, v] for k, v in parts.items()] + [[f"c={c}", "TOTAL (derived)", total]]
        self.res.stage("ttfa_server_derived", out)
        self.res.table("DERIVED TTFA_server estimate from component medians (single-GPU-equivalent thinker, "
                       "all c streams batched in lockstep; not an end-to-end measurement) (ms)",
                       ["concurrency", "stage", "ms"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--thinker-layers", type=int, default=7, help="layers built (1 dense + N-1 MoE); 32 extrapolated")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip stages that start after this many seconds")
    ap.add_argument("--segment-tokens", type=int, default=5, help="thinker decode steps to a ~3-word first segment")
    ap.add_argument("--compile-talker", action="store_true", help="also time talker leaf modules under torch.compile")
    ap.add_argument("--stages", default="", help="comma-separated subset of stages to run (default: all)")
    ap.add_argument("--talker-buckets", type=lambda v: [int(x) for x in v.split(",")], default=list(TALKER_BUCKETS),
                    help="batch buckets graphed and timed for the talker and VAE (comma-separated)")
    ap.add_argument("--dry-cpu", action="store_true", help="plumbing check on CPU with the tiny preset")
    ap.add_argument("--no-fused", action="store_true", help="reference PyTorch ops instead of the Triton "
                    "kernels of model.kernels (A/B; the MoE prefill experts stay Triton)")
    ap.add_argument("--tp-shadow", type=int, default=1, help="build the thinker as one rank of TP=N with the "
                    "collectives skipped: per-GPU compute of a TP=N deployment on one GPU")
    args = ap.parse_args()
    global DEV
    if args.dry_cpu:
        DEV = "cpu"
    elif not torch.cuda.is_available():
        sys.exit("gpu_bench needs a CUDA GPU (or --dry-cpu)")
    elif not available():
        sys.exit("gpu_bench needs Triton")
    bench = Bench(args)
    stages = ["ceilings", "thinker", "thinker_prefill", "talker", "talker_profile", "vae", "talker_throughput", "encoders",
              "derived_ttfa"]
    if args.compile_talker:
        stages.append("talker_compiled")
    if args.stages:
        stages = [st for st in stages if st in args.stages.split(",")]
    for name in stages:
        if bench.over_budget(name):
            continue
        try:
            getattr(bench, name)()
        except Exception as exc:  # noqa: BLE001 - keep going: one broken stage must not lose the others' numbers
            import traceback

            traceback.print_exc()
            bench.res.note(f"stage {name} failed: {type(exc).__name__}: {exc}")
    bench.res.save()
    print(bench.res.markdown(), flush=True)


if __name__ == "__main__":
    main()
