"""TTFA of replies in a cloned voice vs a preset voice (issue 19: "same TTFA ± noise").

Registers a voice (`POST /v1/realtime/voices`, from `--clip` + `--transcript`, else an espeak-ng clip),
then runs `--runs` pairs of text turns, each in a fresh session, alternating preset / cloned so drift
hits both alike: TTFA = `response.create` sent → first `response.output_audio.delta`. Prints the
per-run numbers and the medians as JSON (also written to `--out`).

    python3 -m bench.voice_clone                      # in-process server, embedded tiny model (CPU)
    python3 -m bench.voice_clone --set engine.model_path=/models/Ming-flash-omni-2.0 --runs 20
    python3 -m bench.voice_clone --url ws://gpu-host:8000 --api-key KEY --runs 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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


def _espeak_clip(folder: Path) -> Path:
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng not found: pass --clip and --transcript")
    path = folder / "clip.wav"
    subprocess.run(["espeak-ng", "-w", str(path), _TRANSCRIPT], check=True, capture_output=True)
    return path


async def _ttfa(url: str, api_key: str | None, voice, prompt: str, max_tokens: int) -> float:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with connect(url, additional_headers=headers, max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"output": {"voice": voice}}}}))
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}}))
        while json.loads(await ws.recv())["type"] != "conversation.item.added":
            pass
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


async def _bench(args, url: str) -> dict:
    clip = Path(args.clip) if args.clip else _espeak_clip(Path(tempfile.mkdtemp()))
    voice = await register_voice(url, clip, args.transcript, name="bench", api_key=args.api_key)
    voices = {"preset": args.preset_voice, "cloned": {"id": voice.id}}
    for name, v in voices.items():  # warm-up, not counted
        await _ttfa(url, args.api_key, v, args.prompt, args.max_tokens)
    runs: dict[str, list[float]] = {"preset": [], "cloned": []}
    for i in range(args.runs):
        order = ("preset", "cloned") if i % 2 == 0 else ("cloned", "preset")
        for name in order:
            runs[name].append(await _ttfa(url, args.api_key, voices[name], args.prompt, args.max_tokens))
    medians = {name: statistics.median(values) for name, values in runs.items()}
    return {"runs": {k: [round(v * 1000, 2) for v in vs] for k, vs in runs.items()},
            "median_ttfa_ms": {k: round(v * 1000, 2) for k, v in medians.items()},
            "cloned_minus_preset_ms": round((medians["cloned"] - medians["preset"]) * 1000, 2),
            "voice_duration_s": voice.duration_s}


async def _main(args) -> dict:
    if args.url:
        return await _bench(args, args.url)
    from realtime_ming.server import RealtimeServer
    from realtime_ming.server.app import load_engine
    from realtime_ming.server.config import load_serve_config

    cfg = load_serve_config(args.config, ["server.port=0", *args.set])
    engine = await asyncio.to_thread(load_engine, cfg)
    try:
        async with RealtimeServer(cfg, engine) as server:
            result = await _bench(args, f"ws://127.0.0.1:{server.port}/v1/realtime")
            result["device"] = engine.info().get("device")
            return result
    finally:
        with contextlib.suppress(Exception):
            engine.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (ws:// or http://); default: start one in-process")
    p.add_argument("--api-key")
    p.add_argument("--config", help="server config file for the in-process server")
    p.add_argument("--set", action="append", default=[], help="config override key=value (repeatable)")
    p.add_argument("--clip", help="voice clip (default: espeak-ng speaking --transcript)")
    p.add_argument("--transcript", default=_TRANSCRIPT)
    p.add_argument("--preset-voice", default="alloy", help="the preset (or alias) to compare with")
    p.add_argument("--prompt", default="Tell me something about the sea.")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", help="write the JSON result here")
    args = p.parse_args(argv)
    result = asyncio.run(_main(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
