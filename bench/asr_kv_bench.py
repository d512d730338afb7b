"""First audio of a spoken reply with input transcription on vs off (tiny model, CPU, real server on loopback).

Each run opens a session (server VAD, speculative turns as shipped), streams an espeak-ng utterance at real time
followed by silence, and measures on the client, from `input_audio_buffer.speech_stopped`, the reply's first
`response.output_audio.delta` (and, with transcription on, `conversation.item.input_audio_transcription.completed`).
The tiny model's reply and transcript are forced to real words (`REPLY`, `UTTERANCE`). Runs alternate off / on so drift on the shared machine hits both alike; medians are reported. With transcription
on, the transcription side request reuses the reply's prefilled K/V (`session/transcription.py`): it is submitted
at the reply's first audio and prefills only the ASR instruction.

    python3 -m bench.asr_kv_bench [--pairs 5] [--out bench/out/asr-kv/results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
from websockets.asyncio.client import connect

from realtime_ming.audio.resample import resample_torchaudio_compatible
from realtime_ming.engine import Engine
from realtime_ming.engine.config import EngineConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.server import RealtimeServer, load_config

WIRE_HZ = 24000
CHUNK_MS = 20
UTTERANCE = "What time is it now in Hangzhou?"
# the random tiny model's own tokens are rarely speakable words: the reply and the transcript are forced to
# realistic text (every model computation still runs), so the talker speaks and the ASR decodes a real length
REPLY = "It is three in the afternoon in Hangzhou right now."


def _espeak(text: str) -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is needed (apt-get install -y espeak-ng)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
        wav, sr = sf.read(path, dtype="float32")
    import torch

    x = resample_torchaudio_compatible(torch.from_numpy(wav), sr, WIRE_HZ).numpy()
    loud = np.flatnonzero(np.abs(x) > 1e-3)
    return x[loud[0]:loud[-1] + 1]


def _b64(samples: np.ndarray) -> str:
    pcm = np.clip(np.rint(samples * 32768.0), -32768, 32767).astype("<i2")
    return base64.b64encode(pcm.tobytes()).decode()


class _explain:
    """A 90 s limit on one run; its TimeoutError says which events came."""

    def __init__(self, seen: list) -> None:
        self._seen, self._timeout = seen, asyncio.timeout(90)

    async def __aenter__(self):
        await self._timeout.__aenter__()

    async def __aexit__(self, *exc):
        try:
            return await self._timeout.__aexit__(*exc)
        except TimeoutError as error:
            raise TimeoutError(f"run unfinished after 90 s; events: {sorted(set(self._seen))}") from error


async def _run(port: int, audio: np.ndarray, transcription: bool) -> dict:
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=ming", max_size=None) as ws:
        session = {"type": "realtime", "max_output_tokens": 12}
        if transcription:
            session["audio"] = {"input": {"transcription": {"model": "whisper-1", "language": "en"}}}
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        step = WIRE_HZ * CHUNK_MS // 1000
        stopped = first_audio = transcribed = None
        done = False

        async def send() -> None:
            start = time.monotonic()
            for i, s in enumerate(range(0, audio.size, step)):
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": _b64(audio[s:s + step])}))
                await asyncio.sleep(max(0.0, start + (i + 1) * CHUNK_MS / 1000 - time.monotonic()))

        sender = asyncio.create_task(send())
        seen: list[str] = []
        async with _explain(seen):
            while not (done and first_audio is not None and (transcribed is not None or not transcription)):
                event = json.loads(await ws.recv())
                now, kind = time.monotonic(), event["type"]
                seen.append(kind)
                if kind == "input_audio_buffer.speech_stopped" and stopped is None:
                    stopped = now
                elif kind == "response.output_audio.delta" and first_audio is None:
                    first_audio = now
                elif kind == "conversation.item.input_audio_transcription.completed":
                    transcribed = now
                elif kind == "response.done":
                    done = True
                elif kind == "error":
                    raise RuntimeError(event)
                if kind == "response.done" and event["response"]["status"] not in ("completed", "incomplete"):
                    raise RuntimeError(f"reply ended {event['response']['status']}: {event['response'].get('status_details')}")
                if len(seen) > 5000:
                    raise RuntimeError(f"no end after {len(seen)} events: {sorted(set(seen))}")
        sender.cancel()
    return {"transcription": transcription, "first_audio_ms": (first_audio - stopped) * 1e3,
            "transcript_ms": None if transcribed is None else (transcribed - stopped) * 1e3}


async def _main(args) -> dict:
    speech = _espeak(UTTERANCE)
    audio = np.concatenate([np.zeros(WIRE_HZ // 4, np.float32), speech, np.zeros(int(WIRE_HZ * 1.5), np.float32)])
    engine = Engine.create(EngineConfig(), hooks=EngineHooks(forced_reply=REPLY, forced_transcript=UTTERANCE))
    runs = []
    try:
        async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as server:
            await _run(server.port, audio, True)  # warm-up (first-call costs), not counted
            for i in range(args.pairs):
                for on in ((False, True) if i % 2 == 0 else (True, False)):
                    runs.append(await _run(server.port, audio, on))
                    print(json.dumps(runs[-1]), flush=True)
    finally:
        engine.close()
    off = [r["first_audio_ms"] for r in runs if not r["transcription"]]
    on = [r["first_audio_ms"] for r in runs if r["transcription"]]
    summary = {"first_audio_ms_median_off": statistics.median(off), "first_audio_ms_median_on": statistics.median(on),
               "transcript_ms_median": statistics.median(r["transcript_ms"] for r in runs if r["transcription"]),
               "pairs": args.pairs, "speech_s": round(speech.size / WIRE_HZ, 2), "utterance": UTTERANCE}
    return {"summary": summary, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = asyncio.run(_main(args))
    print(json.dumps(result["summary"], indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
