"""Where one spoken turn's time goes inside the engine on a GPU (in-process: no server, no VAD, no sockets).

    python bench/engine_profile.py --config bench/configs/shadow-tp2-1gpu.yaml --out DIR [--turns-dir .turns]

For each espeak-ng clip of the turns cache: the audio encoder alone (three calls through the clip-length
graphs, then three eager: the first with a new length, then repeats), then whole turns (text prompt + the clip, forced reply, latency segmenter)
submitted one at a time, with every engine stage in ms after submission. Last, one turn under
torch.profiler: the ops with the most CPU and the most GPU time. Writes DIR/engine_profile.json and
prints the tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from realtime_ming.engine import Engine  # noqa: E402
from realtime_ming.engine.api import (  # noqa: E402
    AudioChunk,
    Content,
    Message,
    SamplingParams,
    StageMark,
    TurnDone,
    TurnFailed,
    TurnRequest,
)
from realtime_ming.engine.hooks import EngineHooks  # noqa: E402
from realtime_ming.engine.input_processor import _to_16k  # noqa: E402
from realtime_ming.server import load_config  # noqa: E402

REPLY = "Sure. The weather today looks sunny, with a light breeze from the west and a high of twenty degrees. "


def run_turn(engine: Engine, turn_id: str, clip: np.ndarray, rate: int) -> dict:
    """Submit one turn and wait for it; stage times (ms after SUBMITTED) and the first audio chunk."""
    done, marks, first_audio = threading.Event(), {}, []

    def sink(ev):
        if isinstance(ev, StageMark):
            marks[ev.stage.value] = ev.t
        elif isinstance(ev, AudioChunk) and not first_audio:
            first_audio.append(time.monotonic())
        elif isinstance(ev, (TurnDone, TurnFailed)):
            marks["end"] = time.monotonic()
            done.set()

    msg = Message("user", (Content.of_text("Answer briefly."), Content.of_audio(clip, rate)))
    engine.submit(TurnRequest(turn_id, turn_id, (msg,), sampling=SamplingParams(max_tokens=48, ignore_eos=True)),
                  sink)
    if not done.wait(120):
        raise RuntimeError(f"turn {turn_id} did not finish")
    t0 = marks.pop("submitted")
    out = {k: round((v - t0) * 1e3, 1) for k, v in marks.items()}
    if first_audio:
        out["first_audio_chunk"] = round((first_audio[0] - t0) * 1e3, 1)
    return out


def encoder_times(engine: Engine, clip: np.ndarray, rate: int) -> dict[str, list[float]]:
    """Audio frontend + encoder + projector, synchronised, 3 calls each: the clip-length graphs, then eager."""
    wave = _to_16k(clip, rate)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    out = {}
    for mode in ("graphed", "eager"):
        times = []
        for _ in range(3):
            sync()
            t = time.perf_counter()
            engine.bundle.encode_audio(wave, graphed=mode == "graphed")
            sync()
            times.append(round((time.perf_counter() - t) * 1e3, 2))
        out[mode] = times
    return out


def profile_prefill(engine: Engine, tokens: int, audio_tokens: int = 0) -> dict:
    """One prefill of `tokens` tokens (the last `audio_tokens` of them through the audio router) into a free
    KV slot, as the engine runs it: through the graphed prefiller when one serves the width (else eager).
    Wall time (synchronised) vs the GPU time of its kernels, and the kernels with the most GPU time."""
    runner = engine._thinker
    thinker, dev = runner.model, runner.device
    embeds = thinker.embed(torch.randint(0, 1000, (1, tokens), device=dev))
    pos = torch.arange(tokens, device=dev)[None]
    slot = torch.tensor([runner.cache.num_slots - 1], device=dev)
    audio = torch.zeros(1, tokens, dtype=torch.bool, device=dev)
    audio[:, tokens - audio_tokens:] = audio_tokens > 0
    image = torch.zeros_like(audio)
    graphed = runner.prefiller is not None and runner.prefiller.fits(tokens)

    def run():
        with torch.no_grad():
            if graphed:
                return runner.prefiller.step(embeds, pos.expand(3, 1, tokens), pos, slot, image, audio)
            return thinker(embeds, pos.expand(3, 1, tokens), cache=runner.cache, slots=slot, cache_positions=pos,
                           kv_len=min(runner.cache.capacity, -(-tokens // 64) * 64), image_mask=image,
                           audio_mask=audio)

    run()
    walls = []
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        run()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t) * 1e3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    ka = prof.key_averages()
    gpu_ms = sum(e.self_device_time_total for e in ka) / 1e3
    return {"tokens": tokens, "audio_tokens": audio_tokens, "graphed": graphed, "wall_ms": [round(w, 1) for w in walls],
            "gpu_kernels_ms": round(gpu_ms, 1), "top": ka.table(sort_by="self_cuda_time_total", row_limit=20)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--turns-dir", default=".turns")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides a.b=c")
    args = ap.parse_args()
    overrides = ["engine.preset=ming-flash-omni-2.0", "engine.weights=dummy", "engine.segmenter.policy=latency",
                 *args.set]
    cfg = load_config(args.config, overrides).engine
    t = time.time()
    engine = Engine.create(cfg, hooks=EngineHooks(forced_reply=REPLY))
    report = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "command": " ".join(sys.argv),
              "startup_s": round(time.time() - t, 1), "clips": []}
    clips = sorted(Path(args.turns_dir).glob("*.wav"), key=lambda p: sf.info(str(p)).duration)
    try:
        for i, path in enumerate(clips):
            clip, rate = sf.read(str(path), dtype="float32")
            row = {"clip": path.name, "seconds": round(len(clip) / rate, 2), "encoder_ms": encoder_times(engine, clip, rate)}
            row["turns"] = [run_turn(engine, f"p{i}-{k}", clip, rate) for k in range(2)]
            report["clips"].append(row)
            print(json.dumps(row), flush=True)
        if torch.cuda.is_available():
            report["prefill"] = [profile_prefill(engine, n, a) for n, a in ((100, 0), (100, 40), (400, 120))]
            for row in report["prefill"]:
                print({k: v for k, v in row.items() if k != "top"}, flush=True)
                print(row["top"], flush=True)
        clip, rate = sf.read(str(clips[len(clips) // 2]), dtype="float32")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            report["profiled_turn"] = run_turn(engine, "profiled", clip, rate)
        ka = prof.key_averages()
        report["top_cpu"] = ka.table(sort_by="self_cpu_time_total", row_limit=25)
        print(report["top_cpu"], flush=True)
        if torch.cuda.is_available():
            report["top_cuda"] = ka.table(sort_by="self_cuda_time_total", row_limit=25)
            print(report["top_cuda"], flush=True)
    finally:
        engine.close()
    stages = ["encoders_done", "prefill_done", "first_segment", "first_talker_step", "first_pcm", "first_audio_chunk"]
    print("| clip s | encoder ms (3 calls) | " + " | ".join(stages) + " |")
    for row in report["clips"]:
        med = {s: statistics.median(t.get(s, float("nan")) for t in row["turns"]) for s in stages}
        print(f"| {row['seconds']} | {row['encoder_ms']} | " + " | ".join(f"{med[s]:.0f}" for s in stages) + " |")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "engine_profile.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
