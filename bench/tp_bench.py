"""Tensor-parallel thinker benchmark at the full Ming-flash-omni-2.0 shapes with dummy weights (issue 8).

    python bench/tp_bench.py --tp 4 --out DIR                                # one process per GPU, NCCL
    python bench/tp_bench.py --tp 2 --device cpu --preset tiny --out DIR     # gloo, plumbing / parity

Thinker only: the vision/audio encoders and the talker are not built (audio tokens enter as
random unit-norm embeddings through the audio router). Every rank builds its shard; all ranks run
the same steps in lockstep and rank 0 reports: (a) prefill of a 40-token prompt + 25 audio tokens
(1 s) -> first token; (b) decode tok/s per stream per batch bucket, eager and CUDA-graphed (embed ->
stack -> lm_head -> argmax); (c) aggregate tok/s; plus collectives alone and the weight-bytes floor.
`--stages ...,profile` adds each bucket's graphed step under torch.profiler (bench/step_profile.py: kernels,
launches, GPU idle time); `--fp8-plan` picks the FP8 decode plan (bench/fp8_variants.py) for A/B runs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
import traceback
from pathlib import Path

# NVLink multicast stays off on shared hosts (device README); set before NCCL initialises, and
# inherited by the spawned ranks
_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(_NCCL_ENV)

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fp8_variants
import step_profile
from gpu_timing import measure_ceilings, param_bytes
from tp_report import Report, device_info, markdown

from realtime_ming._exit import exit_now
from realtime_ming.engine.graphs import BucketedGraph, GraphInput
from realtime_ming.model import moe
from realtime_ming.model.config import ThinkerConfig, load_checkpoint_config
from realtime_ming.model.kernels import Kernels, available
from realtime_ming.model.kernels.all_reduce import OneShotAllReduce
from realtime_ming.model.layers import TPGroup
from realtime_ming.model.loader import init_dummy, load_weights, read_weight_map
from realtime_ming.model.presets import preset_config, tiny_config
from realtime_ming.model.thinker import Thinker, ThinkerKVCache

__all__ = ["main"]

STAGES = ("prefill", "greedy", "decode", "collectives", "floor", "profile")  # profile: only when asked
ROW_STRIDE = 29  # decode row i starts at prompt length + i·stride: every row at a different length


# ---- setup -------------------------------------------------------------------------------------

def _thinker_config(args) -> ThinkerConfig:
    if args.checkpoint and (Path(args.checkpoint) / "config.json").is_file():
        return load_checkpoint_config(args.checkpoint).thinker
    if args.preset == "tiny":
        from realtime_ming.model.tiny_tokenizer import (
            TINY_VOCAB_SIZE,
            tiny_talker_special_ids,
            tiny_thinker_special_ids,
        )

        return tiny_config(tiny_thinker_special_ids(), tiny_talker_special_ids(), TINY_VOCAB_SIZE).thinker
    return preset_config(args.preset).thinker


def _kernels(args) -> Kernels:
    """The Triton kernels where they apply (CUDA), the MoE experts as `--moe` says."""
    return Kernels(triton=True, moe_experts=args.moe == "triton")


def _build_shard(cfg: ThinkerConfig, args, tp: TPGroup, device: torch.device, dtype: torch.dtype) -> Thinker:
    """This rank's shard: checkpoint keys `model.*` narrowed by the loader, or seeded dummy values."""
    with torch.device("meta"):
        thinker = Thinker(cfg, tp, kernels=_kernels(args), expert_dtype=args.expert_dtype)
    if args.checkpoint:
        load_weights(thinker, read_weight_map(args.checkpoint), prefix="model.", device=device, dtype=dtype, tp=tp,
                     what=f"thinker rank {tp.rank}")
    else:  # every rank the same seed: shard values differ from a TP=1 model's (fine for timing)
        init_dummy(thinker, seed=args.seed, device=device, dtype=dtype)
    return thinker.eval()


class Lockstep:
    """Rank 0 decides whether a stage still fits the time budget and tells every rank (same collectives)."""

    def __init__(self, report: Report, budget_s: float):
        self.report, self.budget_s = report, budget_s

    def go(self, stage: str) -> bool:
        spent = time.time() - self.report.t0
        flag = [spent <= self.budget_s]
        dist.broadcast_object_list(flag, src=0)
        if not flag[0]:
            self.report.note(f"stage {stage} skipped: {spent:.0f} s spent > budget {self.budget_s:.0f} s")
        else:
            self.report.log(f"== {stage}")
        return bool(flag[0])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


# ---- steps -------------------------------------------------------------------------------------

def _prompt(cfg: ThinkerConfig, batch: int, args, device, dtype):
    """Token ids [B, T] int64, audio embeddings [B, T, D] (unit norm), audio mask [B, T] bool; seeded on CPU."""
    t = args.prompt_tokens + args.audio_tokens
    gen = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (batch, t), generator=gen)
    feats = torch.randn(batch, t, cfg.hidden_size, generator=gen)
    feats = feats / feats.norm(dim=-1, keepdim=True)  # the audio projector's output is unit-norm
    mask = torch.zeros(batch, t, dtype=torch.bool)
    start = args.prompt_tokens // 2  # system/user text, then the 1 s clip, then the rest of the turn
    mask[:, start:start + args.audio_tokens] = True
    return ids.to(device), feats.to(device=device, dtype=dtype), mask.to(device)


def _prefill(thinker: Thinker, cache: ThinkerKVCache, ids, feats, audio_mask, kv_len: int) -> torch.Tensor:
    """Prompt rows [B, T] into slots 0..B-1 at positions 0..T-1 -> first greedy token per row [B]."""
    b, t = ids.shape
    x = torch.where(audio_mask[..., None], feats, thinker.embed(ids))  # [B, T, D]
    pos = torch.arange(t, device=ids.device).expand(b, t)
    h = thinker(x, pos.unsqueeze(0).expand(3, b, t), cache=cache, slots=torch.arange(b, device=ids.device),
                cache_positions=pos, kv_len=kv_len, audio_mask=audio_mask)
    return thinker.logits(h[:, -1]).argmax(-1)


def _decode_fn(thinker: Thinker, cache: ThinkerKVCache, kv_len: int):
    """One whole decode step: tok [B, 1], pos [B, 1] (-1 = padding row), slots [B] -> next token [B]."""
    def step(tok, pos, slots):
        h = thinker(thinker.embed(tok), pos.unsqueeze(0).expand(3, *pos.shape), cache=cache, slots=slots,
                    cache_positions=pos, kv_len=kv_len)
        return thinker.logits(h[:, -1]).argmax(-1)
    return step


def _decode_specs(top: int) -> dict:
    return {"tok": GraphInput((top, 1), torch.int64),  # [max_bs, 1] int64 token ids
            "pos": GraphInput((top, 1), torch.int64, pad=-1),  # [max_bs, 1] cache positions, -1 = sink
            "slots": GraphInput((top,), torch.int64)}  # [max_bs] KV slot per row


def _generate(run, first: torch.Tensor, pos0: torch.Tensor, slots: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy decode `steps` tokens through `run` (eager fn or graph.step): -> [B, steps] int64."""
    tok, pos, out = first[:, None], pos0, []
    for _ in range(steps):
        nxt = run(tok=tok, pos=pos, slots=slots)
        out.append(nxt.clone())
        tok, pos = nxt[:, None], pos + 1
    return torch.stack(out, dim=1)


def _time_decode(run, batch: int, args, device, steps: int) -> float:
    """ms per decode step: median over reps of `steps` back-to-back steps (host loop included)."""
    slots = torch.arange(batch, device=device)
    pos0 = (args.prompt_tokens + args.audio_tokens + ROW_STRIDE * slots)[:, None]  # [B, 1]
    first = torch.randint(0, 1000, (batch,), device=device)
    _generate(run, first, pos0, slots, 1)  # warm-up
    times = []
    for _ in range(args.reps):
        _sync(device)
        t = time.perf_counter()
        _generate(run, first, pos0, slots, steps)
        _sync(device)
        times.append((time.perf_counter() - t) * 1e3 / steps)
    return _median(times)


def _collectives_fn(thinker: Thinker):
    """The step's collectives alone: embedding + 2 per layer all-reduces [B, 1, D], the lm_head all-gather."""
    tp, cfg = thinker.tp, thinker.cfg
    n_reduce = 1 + 2 * cfg.num_hidden_layers

    def step(x):  # x [B, 1, D] model dtype, zeros
        y = x
        for _ in range(n_reduce):
            y = tp.all_reduce(y.clone())
        logits = x.new_zeros(x.shape[0], cfg.vocab_size // tp.size)
        return tp.all_gather_last(logits)[:, :1] + y[:, 0, :1]
    return step


# ---- stages ------------------------------------------------------------------------------------

class Bench:
    def __init__(self, thinker: Thinker, cache: ThinkerKVCache, args, device, dtype, report: Report):
        self.thinker, self.cache, self.args = thinker, cache, args
        self.device, self.dtype, self.report = device, dtype, report
        self.step = _decode_fn(thinker, cache, args.kv_len)

    def prefill(self) -> None:
        out = {}
        for batch in sorted({1, max(self.args.batches)}):
            ids, feats, mask = _prompt(self.thinker.cfg, batch, self.args, self.device, self.dtype)
            times = []
            for i in range(self.args.reps + 1):
                _sync(self.device)
                t = time.perf_counter()
                _prefill(self.thinker, self.cache, ids, feats, mask, self.args.kv_len)
                _sync(self.device)
                if i:  # the first call is the warm-up (kernel JIT, allocator)
                    times.append((time.perf_counter() - t) * 1e3)
            out[f"B{batch}"] = {"tokens_per_row": ids.shape[1], "median_ms": _median(times), "min_ms": min(times)}
            self.report.log(f"prefill B={batch} T={ids.shape[1]}: {out[f'B{batch}']['median_ms']:.2f} ms")
        self.report.put("prefill", out)

    def greedy(self) -> None:
        """First token + `check_tokens` greedy tokens of slot 0 after the B=1 prompt, eager and graphed."""
        args, dev = self.args, self.device
        ids, feats, mask = _prompt(self.thinker.cfg, 1, args, dev, self.dtype)
        first = _prefill(self.thinker, self.cache, ids, feats, mask, args.kv_len)
        slots, pos0 = torch.zeros(1, dtype=torch.int64, device=dev), torch.full((1, 1), ids.shape[1], device=dev)
        eager = _generate(self.step, first, pos0, slots, args.check_tokens)
        graph = BucketedGraph(self.step, _decode_specs(1), (1,), device=dev, enforce_eager=not args.graphs)
        graphed = _generate(graph.step, first, pos0, slots, args.check_tokens)
        res = {"first_token": first.tolist(), "eager": eager[0].tolist(), "graphed": graphed[0].tolist(),
               "graph_is_captured": graph.graphed}
        res["graphed_equals_eager"] = res["eager"] == res["graphed"]
        self.report.log(f"greedy: {res}")
        self.report.put("greedy", res)
        del graph

    def decode(self, lock: Lockstep) -> None:
        args, out = self.args, {}
        self.report.put("decode", out)
        for batch in args.batches:
            if not lock.go(f"decode eager B={batch}"):
                break
            ms = _time_decode(self.step, batch, args, self.device, args.eager_steps)
            out[batch] = {"eager_ms": ms, "eager_tok_s_per_stream": 1e3 / ms}
            self.report.log(f"eager B={batch}: {ms:.2f} ms/step = {1e3 / ms:.1f} tok/s per stream")
            self.report.save()
        if not (args.graphs and lock.go("decode graphed: capture")):
            return
        graph = BucketedGraph(self.step, _decode_specs(max(args.batches)), args.batches, device=self.device)
        t = time.perf_counter()
        graph.capture()
        self.report.data["decode_capture_s"] = round(time.perf_counter() - t, 2)
        self.report.log(f"captured buckets {args.batches} in {self.report.data['decode_capture_s']} s")
        for batch in args.batches:
            if not lock.go(f"decode graphed B={batch}"):
                break
            ms = _time_decode(graph.step, batch, args, self.device, args.steps)
            row = out.setdefault(batch, {})
            row.update({"graph_ms": ms, "graph_tok_s_per_stream": 1e3 / ms, "graph_tok_s_aggregate": batch * 1e3 / ms})
            self.report.log(f"graph B={batch}: {ms:.3f} ms/step = {1e3 / ms:.1f} tok/s per stream, "
                            f"{batch * 1e3 / ms:.0f} aggregate")
            self.report.save()
        del graph

    def profile(self) -> None:
        """Each bucket's graphed step under torch.profiler: kernels, launches and GPU idle time per step."""
        out = {}
        self.report.put("profile", out)
        for batch in self.args.batches:
            graph = BucketedGraph(self.step, _decode_specs(batch), (batch,), device=self.device)
            graph.capture()
            slots = torch.arange(batch, device=self.device)
            pos = (self.args.prompt_tokens + self.args.audio_tokens + ROW_STRIDE * slots)[:, None]
            tok = torch.randint(0, 1000, (batch, 1), device=self.device)
            out[batch] = step_profile.kernel_profile(lambda: graph.step(tok=tok, pos=pos, slots=slots))
            self.report.log(f"profile B={batch}: " + step_profile.markdown(out[batch])[0])
            self.report.save()
            del graph

    def collectives(self) -> None:
        """Collectives of one decode step alone, graphed per bucket like the step (the TP overhead)."""
        d = self.thinker.cfg.hidden_size
        top = max(self.args.batches)
        graph = BucketedGraph(_collectives_fn(self.thinker), {"x": GraphInput((top, 1, d), self.dtype)},
                              self.args.batches, device=self.device, enforce_eager=not self.args.graphs)
        graph.capture()
        out = {}
        for batch in self.args.batches:
            x = torch.zeros(batch, 1, d, device=self.device, dtype=self.dtype)
            graph.step(x=x)
            times = []
            for _ in range(self.args.reps):
                _sync(self.device)
                t = time.perf_counter()
                for _ in range(self.args.steps):
                    graph.step(x=x)
                _sync(self.device)
                times.append((time.perf_counter() - t) * 1e3 / self.args.steps)
            out[batch] = _median(times)
        self.report.log(f"collectives per step (ms): {out}")
        self.report.put("collectives_ms", out)
        del graph

    def floor(self) -> None:
        """Bytes one decode step must read per rank (dense weights, experts used, KV) and its time at copy speed."""
        thinker, cfg, args = self.thinker, self.thinker.cfg, self.args
        bw = measure_ceilings(self.device.type) if self.device.type == "cuda" else None
        local_i = cfg.moe_intermediate_size // thinker.tp.size
        expert_bytes = thinker.model.layers[cfg.first_k_dense_replace].mlp.experts_down.element_size()  # fp8: 1
        per_expert = 3 * cfg.hidden_size * local_i * expert_bytes
        skip = ("experts_gate_up", "experts_down", "image_gate", "audio_gate", "word_embeddings")
        dense = param_bytes(thinker, skip=skip)
        out = {"copy_GBps": bw and bw["copy_GBps"], "bf16_matmul_TFLOPs": bw and bw["bf16_matmul_TFLOPs"]}
        for batch in sorted({1, max(args.batches)}):
            routing: list = []
            slots = torch.arange(batch, device=self.device)
            pos = (args.prompt_tokens + args.audio_tokens + ROW_STRIDE * slots)[:, None]
            with torch.no_grad():
                thinker(thinker.embed(torch.randint(0, 1000, (batch, 1), device=self.device)),
                        pos.unsqueeze(0).expand(3, batch, 1), cache=self.cache, slots=slots, cache_positions=pos,
                        kv_len=args.kv_len, routing=routing)
            experts = sum(int(r.expert_ids.unique().numel()) for r in routing) * per_expert
            kv_heads = cfg.num_key_value_heads // thinker.tp.size
            kv = cfg.num_hidden_layers * batch * kv_heads * args.kv_len * cfg.resolved_head_dim * 2 * self.dtype.itemsize
            total = dense + experts + kv
            row = {"bytes_MB": total / 1e6, "dense_MB": dense / 1e6, "experts_MB": experts / 1e6, "kv_MB": kv / 1e6}
            if bw:
                row["floor_ms"] = total / (bw["copy_GBps"] * 1e9) * 1e3
            out[batch] = row
        self.report.log(f"floor: {out}")
        self.report.put("floor", out)


# ---- processes -------------------------------------------------------------------------------------

def _worker(rank: int, args, port: int) -> None:
    os.environ.update(_NCCL_ENV)
    device = torch.device(f"cuda:{rank}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.tp))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.tp)
    try:
        _bench_rank(rank, args, device)
        dist.barrier()  # no rank tears gloo down while a peer is still inside a collective (SIGABRT at exit)
    finally:
        dist.destroy_process_group()


def _spawned_worker(rank: int, args, port: int) -> None:
    _worker(rank, args, port)
    exit_now(0)  # finished: interpreter finalization could still abort the rank (torch's thread teardown)


def _bench_rank(rank: int, args, device: torch.device) -> None:
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    one_shot = OneShotAllReduce(device, dtype) if args.all_reduce == "one_shot" and args.tp > 1 else None
    tp = TPGroup(rank, args.tp, one_shot=one_shot)
    cfg = _thinker_config(args)
    meta = {"date": datetime.date.today().isoformat(), "command": " ".join([Path(sys.executable).name] + sys.argv),
            "tp": args.tp, "gpu_count": args.tp if device.type == "cuda" else 0, "backend": dist.get_backend(),
            "preset": args.preset, "expert_dtype": args.expert_dtype, "fp8_plan": args.fp8_plan, "weights": args.checkpoint or f"dummy (loader.init_dummy, seed {args.seed})",
            "dtype": args.dtype, "all_reduce": args.all_reduce, "moe_experts": args.moe, "cuda_graphs": args.graphs,
            "kv_len": args.kv_len,
            "built": "thinker only (vision/audio encoders and talker not built)",
            "env": {k: os.environ.get(k) for k in _NCCL_ENV}, **device_info(device, rank)}
    report = Report(Path(args.out), meta, enabled=rank == 0)
    lock = Lockstep(report, args.budget_s)
    if args.moe != "triton":
        moe.GATHER_MAX_ROWS = 10 ** 9  # the sync-free gather path, so the step can be captured
    fp8_variants.apply(args.fp8_plan)
    report.log(f"building thinker shard {rank}/{args.tp} ({cfg.num_hidden_layers} layers, {cfg.num_experts} experts)")
    t = time.perf_counter()
    thinker = _build_shard(cfg, args, tp, device, dtype)
    cache = ThinkerKVCache.allocate(cfg, max(args.batches), args.kv_len, device=device, dtype=dtype, tp=tp)
    _sync(device)
    report.data["meta"]["build_s"] = round(time.perf_counter() - t, 1)
    report.data["meta"]["params_per_rank_B"] = round(sum(p.numel() for p in thinker.parameters()) / 1e9, 3)
    report.log(f"built in {report.data['meta']['build_s']} s: {report.data['meta']['params_per_rank_B']} B params")
    bench = Bench(thinker, cache, args, device, dtype, report)
    stages = {"prefill": bench.prefill, "greedy": bench.greedy, "decode": lambda: bench.decode(lock),
              "collectives": bench.collectives, "floor": bench.floor, "profile": bench.profile}
    with torch.no_grad():
        for name, run in stages.items():
            if name not in args.stages or not lock.go(name):
                continue
            try:
                run()
            except Exception as exc:  # noqa: BLE001 - keep the other stages' numbers (same failure on every rank)
                traceback.print_exc()
                report.note(f"stage {name} failed on rank {rank}: {type(exc).__name__}: {exc}")
    mem = {"rank": rank, "allocated_GiB": None, "peak_GiB": None}
    if device.type == "cuda":
        mem.update(allocated_GiB=round(torch.cuda.memory_allocated(device) / 2**30, 2),
                   peak_GiB=round(torch.cuda.max_memory_allocated(device) / 2**30, 2))
    gathered = [None] * args.tp
    dist.all_gather_object(gathered, mem)
    report.put("memory", gathered)
    if rank == 0:
        print(markdown(report.data), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for tp_bench.json / tp_bench.md (rank 0)")
    ap.add_argument("--tp", type=int, default=None, help="processes = TP degree (default: all visible GPUs, or 1)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--preset", default="ming-flash-omni-2.0", choices=("ming-flash-omni-2.0", "tiny"))
    ap.add_argument("--checkpoint", default=None, help="weights with keys model.* (a Ming folder or one file) "
                                                       "instead of dummy; config.json there overrides --preset")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default=None, help="default bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--moe", choices=("triton", "torch"), default=None,
                    help="expert kernel: fused Triton (default where available) or the PyTorch gather path")
    ap.add_argument("--expert-dtype", choices=("model", "fp8"), default="model",
                    help="the routed experts in the model dtype or FP8 (engine.expert_dtype)")
    ap.add_argument("--fp8-plan", default="shipped", help="FP8 decode plan: base, shipped or a JSON file "
                                                          "(bench/fp8_variants.py; A/B runs)")
    ap.add_argument("--all-reduce", choices=("nccl", "one_shot"), default="nccl",
                    help="small all-reduces over NCCL or the symmetric-memory one-shot kernel (engine.thinker.all_reduce)")
    ap.add_argument("--no-graphs", dest="graphs", action="store_false", help="eager only")
    ap.add_argument("--batches", default="1,2,4,8,16", help="decode batch buckets")
    ap.add_argument("--prompt-tokens", type=int, default=40)
    ap.add_argument("--audio-tokens", type=int, default=25, help="25 audio tokens = 1 s of audio")
    ap.add_argument("--kv-len", type=int, default=1024, help="KV capacity per slot = keys read per decode step")
    ap.add_argument("--steps", type=int, default=64, help="graphed decode steps per timed run")
    ap.add_argument("--eager-steps", type=int, default=8, help="eager decode steps per timed run")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per measurement (median)")
    ap.add_argument("--check-tokens", type=int, default=8, help="greedy tokens recorded for the parity check")
    ap.add_argument("--stages", default=",".join(STAGES[:-1]), help=f"of {','.join(STAGES)}")
    ap.add_argument("--budget-s", type=float, default=300.0, help="skip stages that start after this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=int(os.environ.get("MASTER_PORT", "0")),
                    help="rendezvous port on 127.0.0.1 (default $MASTER_PORT or a free one)")
    args = ap.parse_args(argv)
    args.batches = sorted({int(b) for b in args.batches.split(",")})
    args.stages = args.stages.split(",")
    unknown = set(args.stages) - set(STAGES)
    if unknown:
        ap.error(f"unknown stages {sorted(unknown)}; known: {', '.join(STAGES)}")
    try:
        fp8_variants.load(args.fp8_plan)
    except (ValueError, KeyError, TypeError) as exc:
        ap.error(str(exc))
    if args.tp is None:
        args.tp = max(1, torch.cuda.device_count()) if args.device == "cuda" else 1
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    triton_ok = args.device == "cuda" and available()
    args.moe = args.moe or ("triton" if triton_ok else "torch")
    if args.moe == "triton" and not triton_ok:
        ap.error("--moe triton needs CUDA and Triton")
    if args.device == "cpu":
        args.graphs = False
        if args.all_reduce != "nccl":
            ap.error("--all-reduce one_shot needs CUDA")
    elif torch.cuda.device_count() < args.tp:
        ap.error(f"--tp {args.tp} needs {args.tp} GPUs, {torch.cuda.device_count()} visible")
    top_pos = args.prompt_tokens + args.audio_tokens + ROW_STRIDE * (max(args.batches) - 1) + 2 + max(
        args.steps, args.eager_steps, args.check_tokens)
    if top_pos >= args.kv_len:
        ap.error(f"--kv-len {args.kv_len} must exceed the largest position used ({top_pos})")
    return args


def main(argv=None) -> None:
    args = _parse(argv)
    port = args.port or _free_port()
    if args.tp == 1:
        _worker(0, args, port)
    else:
        mp.spawn(_spawned_worker, args=(args, port), nprocs=args.tp, join=True)


if __name__ == "__main__":
    main()
