"""CPU cost of input noise reduction per session: CPU ms per second of audio.

One session's input is replayed as 20 ms appends of noisy espeak-ng speech (base64 PCM16 24 kHz, as a client
sends it), decoded and resampled to 16 kHz as the session does, then through the session's `Denoiser` (WebRTC
noise suppression, plus AGC for far_field). Each round runs the stream with and without the denoiser; the
difference is what noise reduction costs a session (process CPU time, one thread, medians of `--rounds`
interleaved rounds). Run: `python3 -m bench.denoise_bench [--seconds 20] [--rounds 5] [--kind near_field]`.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile
import soxr

from realtime_ming.audio.denoise import Denoiser, suppression_level

_MODEL_HZ = 16000
_WIRE_HZ = 24000
_CHUNK_S = 0.02


def _speech(seconds: float) -> np.ndarray:
    """`seconds` of 24 kHz speech (espeak-ng, repeated) in white noise at −35 dBFS."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.wav"
        text = "Can you tell me a quick fact about the moon? I would like to hear one now, please."
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
        audio, rate = soundfile.read(path, dtype="float32")
    audio = soxr.resample(audio, rate, _WIRE_HZ)
    total = int(seconds * _WIRE_HZ)
    audio = np.tile(audio, total // audio.size + 1)[:total]
    noise = np.random.default_rng(0).normal(0, 10 ** (-35 / 20), total).astype(np.float32)
    return audio + noise


def _appends(audio: np.ndarray) -> list[str]:
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2")
    step = int(_CHUNK_S * _WIRE_HZ)
    return [base64.b64encode(pcm[i: i + step].tobytes()).decode() for i in range(0, pcm.size, step)]


def _session_cpu_s(appends: list[str], denoiser: Denoiser | None) -> float:
    """CPU seconds of decoding (base64, PCM16, 24 -> 16 kHz) and, with `denoiser`, denoising every append."""
    resampler = soxr.ResampleStream(_WIRE_HZ, _MODEL_HZ, 1, dtype="float32")
    start = time.process_time()
    for chunk in appends:
        samples = np.frombuffer(base64.b64decode(chunk), dtype="<i2").astype(np.float32) / 32768
        samples = resampler.resample_chunk(samples)
        if denoiser is not None:
            denoiser.process(samples)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="audio per session and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kind", choices=("near_field", "far_field"), default="near_field")
    parser.add_argument("--strength", type=float, default=1.0)
    args = parser.parse_args()
    appends = _appends(_speech(args.seconds))
    level = suppression_level(args.strength)
    with_nr, without = [], []
    for _ in range(args.rounds):  # interleaved, so a busy host slows both alike
        without.append(_session_cpu_s(appends, None))
        with_nr.append(_session_cpu_s(appends, Denoiser(level, auto_gain=args.kind == "far_field")))
    base, total = statistics.median(without), statistics.median(with_nr)
    per_s = 1000 / args.seconds
    print(f"{args.kind} strength {args.strength} (level {level}), {args.seconds:g} s of audio, {args.rounds} rounds")
    print(f"session input path without noise reduction: {base * per_s:.2f} CPU ms per s of audio")
    print(f"session input path with noise reduction:    {total * per_s:.2f} CPU ms per s of audio")
    print(f"noise reduction alone:                      {(total - base) * per_s:.2f} CPU ms per s of audio"
          f" ({(total - base) / args.seconds * 100:.2f} % of one core per session)")


if __name__ == "__main__":
    main()
