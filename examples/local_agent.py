"""In-process use: a `LocalAgent` runs the Realtime session on an engine in this process, no socket.

    python examples/local_agent.py                       # embedded tiny model (random weights)
    python examples/local_agent.py --model-path /models/Ming-flash-omni-2.0 --output hello.wav

The calls and the typed events are those of `RealtimeClient`: one text turn answered in text,
then one audio turn (committed by hand) answered in speech and saved as a WAV file.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from _common import demo_tone, tiny_demo_hooks

from realtime_ming.engine.config import EngineConfig
from realtime_ming.sdk import LocalAgent


async def main(args: argparse.Namespace) -> int:
    tiny = args.model_path is None
    config = EngineConfig() if tiny else EngineConfig(model_path=args.model_path)
    async with LocalAgent.load(config, hooks=tiny_demo_hooks() if tiny else None) as agent:
        print(f"session {agent.session.id} on {agent.session.model}, voice {agent.session.voice}")
        await agent.update_session(turn_detection=None, max_output_tokens=args.max_output_tokens,
                                   instructions="You are a concise assistant.")
        await agent.add_text("Say hello in one sentence.")
        await agent.create_response(output_modalities="text")
        text_turn = await agent.collect_turn()
        print(f"text turn ({text_turn.status.value}): {text_turn.text!r}")

        await agent.send_audio(demo_tone(1.0, 16000), sample_rate_hz=16000)
        await agent.commit()
        await agent.create_response()
        audio_turn = await agent.collect_turn()
    path = audio_turn.save_wav(args.output)
    print(f"audio turn ({audio_turn.status.value}): {audio_turn.duration_s:.2f} s -> {path}")
    print(f"transcript: {audio_turn.text!r}")
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="checkpoint folder (default: the embedded tiny model)")
    parser.add_argument("--output", type=Path, default=Path("local_reply.wav"))
    parser.add_argument("--max-output-tokens", type=int, default=32)
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
