"""Talker-only throughput: N turns spoken at once by a pool of talker replicas, each replica stepped by the caller
(`inline`, as the engine thread does by default, `engine.talker.driver: inline`) or in a process of its own
(`process`, `engine.talker.driver: process`) -- optionally beside a Python thread that holds the GIL for a share of
the time, as the engine thread does while it schedules and steps the thinker.

The full-size Ming talker and AudioVAE (dummy bf16 weights, a voice without a prompt) on each device, no thinker: a
closed loop keeps `--streams` turns of `--words` words live (a turn that ends is forgotten and replaced at once),
and counts the turns finished and the audio spoken in `--seconds` after a warm-up. On GPUs only.

    python3 -m bench.talker_pool_bench --devices cuda:0,cuda:1 --streams 32 --gil-duty 0,0.7 --out OUT
    python3 -m bench.talker_pool_bench --devices cuda:0,cuda:1 --streams 22 --segments 1,5,5 --members process \
        --gil-duty 0 --out OUT     # turns of three jobs, as the engine's replies: what starting jobs costs
    python3 -m bench.talker_pool_bench --replot OUT/talker_pool_bench.json     # the plot again, from the JSON
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
import time
from pathlib import Path

import numpy as np
import torch

from realtime_ming.engine.config import EngineConfig, PlacementConfig, TalkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.models import ModelBundle, _build, _replicate
from realtime_ming.engine.talker_driver import Enqueue
from realtime_ming.engine.talker_pool import make_talker
from realtime_ming.engine.talker_replica import TalkerReplica
from realtime_ming.model.kernels import TRITON
from realtime_ming.model.presets import preset_config
from realtime_ming.model.talker import Talker
from realtime_ming.model.vae import AudioVAE

from .loop_stats import LOOP_HEADER, loop_members, loop_rates, loop_row, loop_totals
from realtime_ming.bench.report import agg_pyplot, save_figure

RATE = 44_100


def talker_bundle(preset: str, devices: list[str]) -> ModelBundle:
    """The tiny bundle's tokenizers with the full-size talker + VAE (seeded dummy bf16) on every device (`tiny`:
    the embedded tiny model's, a smoke test on CPU)."""
    place = dict(thinker_devices=("cpu",), encoder_device="cpu")
    if preset == "tiny":
        return ModelBundle.load(EngineConfig(placement=PlacementConfig(**place, talker_devices=tuple(devices))))
    tiny = ModelBundle.load(EngineConfig(placement=PlacementConfig(**place, talker_devices=("cpu",))))
    full, dtype = preset_config(preset), torch.bfloat16
    common = dict(dtype=dtype, kernels=TRITON)
    talker = _build(Talker, full.talker, device=devices[0], what="talker", seed=0, **common)
    vae = _build(AudioVAE, full.vae, device=devices[0], what="vae", seed=0, **common)
    replicas = [TalkerReplica(0, talker, vae, torch.device(devices[0]), torch.device(devices[0]))]
    for i, dev in enumerate(devices[1:], start=1):
        replicas.append(TalkerReplica(i, _replicate(talker, Talker, full.talker, device=dev, **common),
                                      _replicate(vae, AudioVAE, full.vae, device=dev, **common),
                                      torch.device(dev), torch.device(dev)))
    big = dataclasses.replace(tiny, cfg=dataclasses.replace(tiny.cfg, talker=full.talker, vae=full.vae), dtype=dtype,
                              talker=talker, vae=vae, talker_replicas=replicas, voices={})
    big.set_preset_voice(tiny.default_voice, "", None)
    big.default_voice = tiny.default_voice
    return big


class GilHog:
    """A thread holding the GIL `duty` of the time in 1 ms bursts of pure Python (0: not started)."""

    def __init__(self, duty: float):
        self.duty, self._stop = duty, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gil-hog")
        if duty > 0:
            self._thread.start()

    def _run(self) -> None:
        rest = 1e-3 * (1 - self.duty) / self.duty
        while not self._stop.is_set():
            t = time.perf_counter()
            while time.perf_counter() - t < 1e-3:
                pass
            time.sleep(rest)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def run(bundle, cfg: EngineConfig, member: str, streams: int, segments: list[int], warm_s: float, seconds: float,
        duty: float) -> dict:
    samples, woken, died = [0], threading.Event(), []
    counting = [False]
    jobs_started: dict[str, int] = {}  # per live turn: its jobs the talker started (first-step outputs delivered)

    def deliver(outputs):
        for o in outputs:
            if o.first_step:
                jobs_started[o.turn_id] = jobs_started.get(o.turn_id, 0) + 1
        if counting[0]:
            samples[0] += sum(0 if o.pcm is None else o.pcm.size for o in outputs)

    pool = make_talker(bundle, cfg, deliver, woken.set, died.append)  # the driver as `cfg` says
    hog = None
    try:
        pool.capture()
        texts = [" ".join(["word"] * words) for words in segments]  # each a talker job of its own
        live, serial = set(), [0]

        def start() -> None:
            turn = f"t{serial[0]}"
            serial[0] += 1
            live.add(turn)
            for i, text in enumerate(texts):
                pool.enqueue(Enqueue(turn, i, text, None, serial[0]))

        for _ in range(streams):
            start()
        hog = GilHog(duty)
        t0 = time.perf_counter()
        done, t_count, jobs_per_turn = 0, None, []
        while t_count is None or time.perf_counter() - t_count < seconds:  # a full window after the warm-up
            if t_count is None and time.perf_counter() - t0 >= warm_s:
                counting[0], done, t_count, jobs_per_turn = True, 0, time.perf_counter(), []
                loops_before = loop_totals(loop_members(pool))
            if member == "inline":
                pool.launch()
                outputs = pool.outputs()
                assert all(o.error is None for o in outputs), outputs
                deliver(outputs)
            else:  # the processes deliver; their notices (`Idle`) are taken here, as the engine thread does
                woken.wait(0.5)
                woken.clear()
                assert pool.outputs() == [], "a talker turn failed"
            for turn in [t for t in live if not pool.pending(t)]:
                live.discard(turn)
                pool.forget(turn)
                jobs_per_turn.append(jobs_started.pop(turn, 0))
                done += 1
                start()
            assert not died, died
        elapsed = time.perf_counter() - t_count
        loops = loop_rates(loops_before, loop_totals(loop_members(pool)), elapsed)
    finally:
        if hog is not None:
            hog.stop()
        pool.close()
    return {"member": member, "gil_duty": duty, "streams": streams, "segments": segments,
            "seconds": round(elapsed, 2), "turns_per_s": round(done / elapsed, 2),
            "audio_s_per_s": round(samples[0] / RATE / elapsed, 2), "loops": loops,
            "jobs_per_turn": sorted(set(jobs_per_turn))}


def plot(report: dict, path: Path) -> Path | None:
    """Grouped bars: turns/s per member, one group per GIL duty."""
    plt = agg_pyplot()
    if plt is None:
        return None
    rows = report["results"]
    duties = sorted({r["gil_duty"] for r in rows})
    members = list(dict.fromkeys(r["member"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / len(members)
    for k, member in enumerate(members):
        values = [next((r["turns_per_s"] for r in rows if r["member"] == member and r["gil_duty"] == d), 0.0)
                  for d in duties]
        ax.bar([i + k * width for i in range(len(duties))], values, width, label=member)
    ax.set_xticks([i + width * (len(members) - 1) / 2 for i in range(len(duties))],
                  [f"GIL held {d:.0%} by another thread" for d in duties])
    ax.set_ylabel("turns / s")
    meta = report["meta"]
    ax.set_title(f"talker only, {meta['args'].get('streams')} turns live, {meta['gpu']} x {len(meta['devices'])}")
    ax.legend()
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default="cuda:0,cuda:1")
    ap.add_argument("--preset", default="ming-flash-omni-2.0", help="the talker's shapes (tiny: a CPU smoke test)")
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--words", type=int, default=8)
    ap.add_argument("--segments", default=None, help="words per talker job of a turn, e.g. 1,5,5 (one job after "
                    "another, as a reply's segments; default: one job of --words)")
    ap.add_argument("--steps-per-word", type=int, default=2)
    ap.add_argument("--members", default="inline,process")
    ap.add_argument("--gil-duty", default="0,0.7", help="shares of time another thread holds the GIL")
    ap.add_argument("--steps-per-launch", type=int, default=2, help="process: engine.talker.steps_per_launch")
    ap.add_argument("--pipeline", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--warm-s", type=float, default=4.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=1, help="runs per cell (the table reports their median)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--replot", type=Path, help="write the plot of an earlier run's JSON next to it")
    args = ap.parse_args(argv)
    if args.replot:
        print(plot(json.loads(args.replot.read_text()), args.replot.with_suffix(".png")))
        return 0
    if args.out is None:
        ap.error("--out is required")
    devices = args.devices.split(",")
    try:
        segments = [int(w) for w in args.segments.split(",")] if args.segments else [args.words]
    except ValueError:
        segments = []
    if not segments or min(segments) < 1:
        ap.error(f"--segments: positive word counts separated by commas, got {args.segments!r}")
    bundle = talker_bundle(args.preset, devices).with_hooks(EngineHooks(steps_per_word=args.steps_per_word))
    per_replica = -(-args.streams // len(devices))
    buckets = tuple(b for b in (1, 2, 4, 8, 16, 24, 32, 48, 64) if b < per_replica) + (per_replica,)
    results = []
    for duty in (float(d) for d in args.gil_duty.split(",")):
        for member in args.members.split(","):
            if member not in ("inline", "process"):
                ap.error(f"--members: inline or process, got {member!r}")
            process = member == "process"
            cfg = EngineConfig(enforce_eager=False, talker=TalkerRunnerConfig(
                max_streams=per_replica, buckets=buckets, driver=member,
                steps_per_launch=args.steps_per_launch if process else 1, pipeline=process and args.pipeline))
            rounds = []
            for k in range(args.rounds):
                print(f"[{member}, GIL duty {duty}] round {k + 1}/{args.rounds}: capture, then "
                      f"{args.warm_s + args.seconds:.0f} s of turns", flush=True)
                rounds.append(run(bundle, cfg, member, args.streams, segments, args.warm_s, args.seconds, duty))
                print(json.dumps(rounds[-1]), flush=True)
            row = dict(rounds[0], rounds=[r["turns_per_s"] for r in rounds])
            for key in ("turns_per_s", "audio_s_per_s"):
                row[key] = float(np.median([r[key] for r in rounds]))
            results.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    meta = {"devices": devices, "gpu": gpu, "torch": torch.__version__,
            "args": {k: str(v) for k, v in vars(args).items()}}
    report = {"meta": meta, "results": results}
    (args.out / "talker_pool_bench.json").write_text(json.dumps(report, indent=1))
    plot(report, args.out / "talker_pool_bench.png")
    lines = ["| member | GIL duty | streams | turns/s (median) | audio s/s (median) | turns/s per round |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['member']} | {r['gil_duty']} | {r['streams']} | {r['turns_per_s']:.1f} | {r['audio_s_per_s']:.1f} "
              f"| {', '.join(f'{x:.1f}' for x in r['rounds'])} |" for r in results]
    lines += ["", f"Talker loops (the first round; per replica but jobs/s), words per job {segments}:", "",
              "| member | GIL duty " + LOOP_HEADER[0], "|---|---" + LOOP_HEADER[1]]
    lines += [f"| {r['member']} | {r['gil_duty']} | {loop_row(r['loops'])} |" for r in results if r["loops"]]
    (args.out / "talker_pool_bench.md").write_text(f"{meta['gpu']} x {len(devices)}\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
