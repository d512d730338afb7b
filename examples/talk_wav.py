"""Talk to a realtime-ming server with a WAV file and save the spoken reply.

    python examples/talk_wav.py --url ws://127.0.0.1:8000/v1/realtime --input question.wav --output reply.wav
    python examples/talk_wav.py                      # serves the tiny model itself, sends a test tone

The input may be any soundfile-readable file at any rate (it is resampled to the session rate).
Turn detection is switched off, so the example commits the audio and asks for the response itself.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import soundfile as sf
from _common import add_connection_args, demo_tone, serve_if_needed

from realtime_ming.sdk import RealtimeClient


async def main(args: argparse.Namespace) -> int:
    async with (
        serve_if_needed(args.url) as url,
        RealtimeClient.connect(url, api_key=args.api_key, model=args.model, beta=args.beta) as client,
    ):
        print(f"session {client.session.id} on {client.session.model}")
        await client.update_session(turn_detection=None, output_format=args.rate,
                                    max_output_tokens=args.max_output_tokens)
        sent_s = await client.stream_file(args.input, realtime=args.realtime)
        await client.commit()
        await client.create_response()
        turn = await client.collect_turn()
    path = turn.save_wav(args.output)
    first_audio = turn.timings.first_audio_s
    print(f"sent {sent_s:.2f} s of audio; reply {turn.status.value}: {turn.duration_s:.2f} s at "
          f"{turn.sample_rate_hz} Hz -> {path}")
    print(f"transcript: {turn.text!r}")
    print("first audio after " + (f"{first_audio * 1000:.0f} ms" if first_audio is not None else "- (no audio)"))
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(parser)
    parser.add_argument("--input", type=Path, help="audio file to say (default: a 1 s test tone)")
    parser.add_argument("--output", type=Path, default=Path("reply.wav"), help="where to save the reply")
    parser.add_argument("--rate", type=int, default=24000, choices=(24000, 44100), help="reply sample rate")
    parser.add_argument("--max-output-tokens", type=int, default=32)
    parser.add_argument("--realtime", action="store_true", help="stream the file at real time like a microphone")
    args = parser.parse_args()
    if args.beta and args.rate != 24000:
        parser.error("the beta dialect only carries 24 kHz audio")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if arguments.input is None:
            arguments.input = Path(folder) / "tone.wav"
            sf.write(arguments.input, demo_tone(), 16000)
        sys.exit(asyncio.run(main(arguments)))
