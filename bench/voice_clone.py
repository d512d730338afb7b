"""TTFA of replies in a cloned voice vs a preset voice with a voice prompt of the same clip (issue 19:
"same TTFA ± noise").

Like is compared with like: a clone adds its transcript and its prompt latents (`<audioPatch>` × N) to
every talker prompt, a preset without a prompt wav (the embedded tiny model's, the dummy full-size
preset's, whose wav is not shipped) adds neither. So the in-process server first gives the compared
preset the same clip + transcript as its voice prompt (`ModelBundle.set_preset_voice`, the checkpoint
presets' registration path), then the clip is registered as a clone (`POST /v1/realtime/voices`).
`--preset-prompt as-is` keeps the preset as loaded (the old, unequal comparison); against `--url` the
preset is whatever that server has.

Rounds alternate the order (A B, B A, ...) so drift hits both alike, each turn in a fresh session:
TTFA = `response.create` sent → first `response.output_audio.delta`. Writes `result.json` (every run,
medians, paired differences, prompt sizes) and `summary.md` to `--out`.

`--talker-profile` skips the server: it times the talker's per-segment work (`TalkerRunner._start`:
prompt build + embeds + LM prefill, and the steps to the first PCM) for the same voices, on the engine's
own runner, so the cost of a voice prompt can be told from the noise of a full reply.

    python3 -m bench.voice_clone --runs 8 --out OUT                   # tiny model, CPU
    python3 -m bench.voice_clone --talker-profile --out OUT           # per-segment talker cost
    python3 -m bench.voice_clone --config configs/ming-flash-omni-2.0.yaml \\
        --set engine.preset=ming-flash-omni-2.0 --set engine.weights=dummy --runs 10 --out OUT   # GPU
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from websockets.asyncio.client import connect

from realtime_ming.sdk.voices import register_voice

_TRANSCRIPT = "The quick brown fox jumps over the lazy dog, and then it runs away."
# dummy weights say nothing speakable: the thinker's reply is forced (every model computation still runs)
_REPLY = "Sure. The sea covers most of the planet, and it is deep, cold and full of life. "


def _espeak_clip(folder: Path, text: str) -> Path:
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng not found: pass --clip and --transcript")
    path = folder / "clip.wav"
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    return path


async def _ttfa(url: str, api_key: str | None, voice, prompt: str, max_tokens: int) -> float:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with connect(url, additional_headers=headers, max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"output": {"voice": voice}}}}))
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}}))
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "error":
                raise RuntimeError(event["error"])
            if event["type"] == "conversation.item.added":
                break
        sent = time.perf_counter()
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": max_tokens}}))
        first = None
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "error":
                raise RuntimeError(event["error"])
            if event["type"] == "response.output_audio.delta" and first is None:
                first = time.perf_counter() - sent
            if event["type"] == "response.done":
                if first is None:
                    raise RuntimeError(f"no audio in the reply: {event['response'].get('status_details')}")
                return first


def _stats(values: list[float]) -> dict:
    ms = [v * 1000 for v in values]
    return {"median_ms": round(statistics.median(ms), 2), "mean_ms": round(statistics.fmean(ms), 2),
            "stdev_ms": round(statistics.stdev(ms), 2) if len(ms) > 1 else 0.0,
            "min_ms": round(min(ms), 2), "max_ms": round(max(ms), 2)}


async def _bench(args, url: str, clip: Path, preset: str) -> dict:
    voice = await register_voice(url, clip, args.transcript, name="bench", api_key=args.api_key)
    voices = {"preset": preset, "cloned": {"id": voice.id}}
    for v in voices.values():  # warm-up, not counted
        await _ttfa(url, args.api_key, v, args.prompt, args.max_tokens)
    runs: dict[str, list[float]] = {"preset": [], "cloned": []}
    for i in range(args.runs):
        order = ("preset", "cloned") if i % 2 == 0 else ("cloned", "preset")  # A B, B A, ...
        for name in order:
            runs[name].append(await _ttfa(url, args.api_key, voices[name], args.prompt, args.max_tokens))
    paired = [(c - p) for p, c in zip(runs["preset"], runs["cloned"])]
    return {"runs_ms": {k: [round(v * 1000, 2) for v in vs] for k, vs in runs.items()},
            "ttfa": {k: _stats(vs) for k, vs in runs.items()},
            "cloned_minus_preset_median_ms": round((statistics.median(runs["cloned"])
                                                    - statistics.median(runs["preset"])) * 1000, 2),
            "paired_difference": _stats(paired),
            "voice_duration_s": voice.duration_s}


def _prompt_sizes(bundle, preset: str, clip: Path, transcript: str) -> dict:
    """Talker-prompt tokens (empty reply text) of the compared voices and of the clip as a clone."""
    import soundfile
    import torch

    from realtime_ming.engine.voice_prompt import soxr_resampler

    enc = bundle.voice_encoder
    wav, sr = soundfile.read(str(clip), dtype="float32", always_2d=True)
    clone = enc.encode(torch.from_numpy(wav[:, 0].copy()), sr, transcript, soxr_resampler)
    prompt, text = bundle.voices[preset]
    return {"preset_prompt_tokens": enc.prompt_tokens(prompt, text), "preset_prompt_patches": prompt.num_patches,
            "cloned_prompt_tokens": enc.prompt_tokens(clone, transcript), "cloned_prompt_patches": clone.num_patches}


def _prepare(bundle, args, clip: Path) -> str:
    """The compared preset's name; with `--preset-prompt clip` it now speaks with the clip as its prompt."""
    preset = args.preset_voice or bundle.default_voice
    if preset not in bundle.voices:
        sys.exit(f"--preset-voice {preset!r} is not a checkpoint voice of this engine: {sorted(bundle.voices)}")
    if args.preset_prompt == "clip":
        bundle.set_preset_voice(preset, args.transcript, clip)
    return preset


async def _serve_and_bench(args, clip: Path) -> dict:
    from realtime_ming.server import RealtimeServer
    from realtime_ming.server.loading import load_engine

    cfg = _config(args)
    engine = await asyncio.to_thread(load_engine, cfg, _hooks(args))
    try:
        preset = _prepare(engine.bundle, args, clip)
        sizes = _prompt_sizes(engine.bundle, preset, clip, args.transcript)
        async with RealtimeServer(cfg, engine) as server:
            result = await _bench(args, f"ws://127.0.0.1:{server.port}/v1/realtime", clip, preset)
        return {"preset_voice": preset, **sizes, **result, "engine": engine.info()}
    finally:
        with contextlib.suppress(Exception):
            engine.close()


def _config(args):
    from realtime_ming.server.config import load_serve_config

    return load_serve_config(args.config, ["server.port=0", *args.set])


def _hooks(args):
    from realtime_ming.engine.hooks import EngineHooks

    return EngineHooks(forced_reply=args.forced_reply or None)


def _talker_profile(args, clip: Path) -> dict:
    """Per-segment talker cost of each voice on the engine's runner (no server, no thinker)."""
    import soundfile
    import torch

    from realtime_ming.engine.models import ModelBundle
    from realtime_ming.engine.talker_runner import TalkerRunner
    from realtime_ming.engine.voice_prompt import soxr_resampler
    from realtime_ming.engine.voice_store import CustomVoice

    cfg = _config(args).engine
    cpu = all(torch.device(d).type == "cpu" for d in (cfg.placement.talker_device, cfg.placement.vae_device))
    if cpu:  # CPU time of this thread is the talker's whole cost: robust to other load on the machine
        torch.set_num_threads(1)
    clock = time.thread_time if cpu else time.perf_counter
    bundle = ModelBundle.load(cfg)
    preset = args.preset_voice or bundle.default_voice
    no_prompt = bundle.voices[preset]
    wav, sr = soundfile.read(str(clip), dtype="float32", always_2d=True)
    clone_prompt = bundle.voice_encoder.encode(torch.from_numpy(wav[:, 0].copy()), sr, args.transcript,
                                               soxr_resampler, check_length=True)
    clone = CustomVoice("voice_bench", "bench", "bench", clone_prompt, args.transcript, len(wav) / sr, 0)
    runners = {"": TalkerRunner(bundle, cfg)}
    if cfg.talker.voice_head_cache > 0:  # the same work without the voice's cached prompt head
        off = dataclasses.replace(cfg, talker=dataclasses.replace(cfg.talker, voice_head_cache=0))
        runners[", no head cache"] = TalkerRunner(bundle, off)
    devices = set()
    for runner in runners.values():
        runner.capture()
        devices |= {d for d in (runner.device, runner.vae_device) if d.type == "cuda"}

    def sync():
        for d in devices:
            torch.cuda.synchronize(d)

    starts: list[tuple[float, int]] = []

    def timed(runner):
        inner = runner._start

        def start(job, queue):
            sync()
            t0 = clock()
            inner(job, queue)
            sync()
            starts.append((clock() - t0, runner.streams[-1].pos))

        runner._start = start

    for runner in runners.values():
        timed(runner)

    def one(runner, voice) -> dict:
        starts.clear()
        sync()
        t0, first, steps = clock(), None, 0
        runner.enqueue("bench", 0, args.segment, voice)
        while runner.has_work():
            outs = runner.step()
            steps += 1
            if first is None and any(o.pcm is not None and o.pcm.size for o in outs):
                first = (clock() - t0, steps)
        runner.forget("bench")
        return {"first_pcm_ms": first[0] * 1000, "first_pcm_step": first[1], "jobs": len(starts),
                "start_ms": [s * 1000 for s, _ in starts], "prompt_tokens": [n for _, n in starts]}

    def with_preset_prompt(prompt):
        bundle.voices[preset] = prompt
        return preset

    voices = {"preset_no_prompt": lambda: with_preset_prompt(no_prompt),
              "preset_clip_prompt": lambda: with_preset_prompt((clone_prompt, args.transcript)),
              "cloned": lambda: clone}
    cases = {name + suffix: (runner, pick) for suffix, runner in runners.items() for name, pick in voices.items()}
    samples: dict[str, list[dict]] = {k: [] for k in cases}
    for runner, pick in cases.values():  # warm-up
        one(runner, pick())
    for i in range(args.runs):
        for name in (list(cases) if i % 2 == 0 else list(cases)[::-1]):
            runner, pick = cases[name]
            samples[name].append(one(runner, pick()))
    out = {}
    for name, runs in samples.items():
        out[name] = {"jobs_per_segment": runs[0]["jobs"], "prompt_tokens": runs[0]["prompt_tokens"],
                     "first_job_start_ms": round(statistics.median(r["start_ms"][0] for r in runs), 2),
                     "later_job_start_ms": round(statistics.median(x for r in runs for x in r["start_ms"][1:]), 2)
                     if runs[0]["jobs"] > 1 else None,
                     "all_job_starts_ms": round(statistics.median(sum(r["start_ms"]) for r in runs), 2),
                     "first_pcm_ms": round(statistics.median(r["first_pcm_ms"] for r in runs), 2),
                     "first_pcm_step": runs[0]["first_pcm_step"]}
    runner = runners[""]
    return {"segment": args.segment, "voice_duration_s": round(len(wav) / sr, 3), "voices": out,
            "clock": "engine-thread CPU time (torch 1 thread)" if cpu else "wall time, CUDA synchronised",
            "head_cache": {"size": runner.heads.size, "hits": runner.heads.hits, "misses": runner.heads.misses},
            "prefill_buckets": list(runner.prefiller.graph.buckets), "graphed": not runner.prefiller.graph.eager,
            "engine": bundle.info() | {"talker": {"max_prompt_len": cfg.talker.max_prompt_len}}}


def _summary(args, result: dict) -> str:
    lines = [f"# voice_clone bench ({'talker profile' if args.talker_profile else 'TTFA'})", "",
             f"command: `python3 -m bench.voice_clone {' '.join(sys.argv[1:])}`", ""]
    if args.talker_profile:
        lines += [f"segment: {result['segment']!r}; clock: {result['clock']} (medians); prefill graph widths "
                  f"{result['prefill_buckets']} (graphed: {result['graphed']}); voice prompt head cache: "
                  f"{result['head_cache']}", "",
                  "| voice | jobs/segment | prompt tokens | first job start ms | later job start ms "
                  "| all starts ms | first PCM ms |", "|---|---|---|---|---|---|---|"]
        for name, v in result["voices"].items():
            lines.append(f"| {name} | {v['jobs_per_segment']} | {v['prompt_tokens']} | {v['first_job_start_ms']} "
                         f"| {v['later_job_start_ms']} | {v['all_job_starts_ms']} | {v['first_pcm_ms']} |")
    else:
        t = result["ttfa"]
        lines += [f"preset `{result.get('preset_voice', args.preset_voice)}` (prompt: {args.preset_prompt}) vs "
                  f"clone of a {result['voice_duration_s']} s clip; {args.runs} rounds A B / B A", "",
                  "| voice | median ms | mean ms | stdev ms | min ms | max ms |", "|---|---|---|---|---|---|"]
        for name in ("preset", "cloned"):
            s = t[name]
            lines.append(f"| {name} | {s['median_ms']} | {s['mean_ms']} | {s['stdev_ms']} | {s['min_ms']} "
                         f"| {s['max_ms']} |")
        lines += ["", f"cloned − preset (medians): {result['cloned_minus_preset_median_ms']} ms; paired "
                      f"difference median {result['paired_difference']['median_ms']} ms "
                      f"(stdev {result['paired_difference']['stdev_ms']} ms)"]
        if "preset_prompt_tokens" in result:
            lines.append(f"talker prompt (empty text): preset {result['preset_prompt_tokens']} tokens, clone "
                         f"{result['cloned_prompt_tokens']} tokens")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (ws:// or http://); default: start one in-process")
    p.add_argument("--api-key")
    p.add_argument("--config", help="server config file for the in-process server")
    p.add_argument("--set", action="append", default=[], help="config override key=value (repeatable)")
    p.add_argument("--clip", help="voice clip (default: espeak-ng speaking --transcript)")
    p.add_argument("--transcript", default=_TRANSCRIPT)
    p.add_argument("--preset-voice", help="the checkpoint voice to compare with (default: the engine's default)")
    p.add_argument("--preset-prompt", choices=("clip", "as-is"), default="clip",
                   help="clip: the preset gets the clip as its voice prompt (like with like); as-is: as loaded")
    p.add_argument("--prompt", default="Tell me something about the sea.")
    p.add_argument("--forced-reply", default=_REPLY,
                   help="in-process: the forced_reply hook (speakable text from dummy weights); '' = off")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--runs", type=int, default=8, help="rounds (each: one turn per voice)")
    p.add_argument("--talker-profile", action="store_true", help="time the talker's per-segment work instead")
    p.add_argument("--segment", default="Sure. The sea covers most of the planet, and it is deep and cold.",
                   help="--talker-profile: the segment text spoken")
    p.add_argument("--out", help="output folder (result.json, summary.md)")
    args = p.parse_args(argv)
    if args.url and (args.talker_profile or args.preset_prompt == "clip"):
        args.preset_prompt = "as-is"  # a remote server's presets are what it loaded
        if args.talker_profile:
            p.error("--talker-profile runs in-process (no --url)")
    clip = Path(args.clip) if args.clip else _espeak_clip(Path(tempfile.mkdtemp()), args.transcript)
    if args.talker_profile:
        result = _talker_profile(args, clip)
    elif args.url:
        result = asyncio.run(_bench(args, args.url, clip, args.preset_voice or "alloy"))
    else:
        result = asyncio.run(_serve_and_bench(args, clip))
    result["argv"] = sys.argv[1:]
    text = json.dumps(result, indent=2, default=str)
    print(text)
    summary = _summary(args, result)
    print(summary)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / ("talker_profile.json" if args.talker_profile else "result.json")).write_text(text + "\n")
        (out / ("talker_profile.md" if args.talker_profile else "summary.md")).write_text(summary)


if __name__ == "__main__":
    main()
