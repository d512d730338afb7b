"""Barge-in: interrupt a spoken reply while it plays, then tell the server how much was heard.

    python examples/barge_in.py --url ws://127.0.0.1:8000/v1/realtime
    python examples/barge_in.py --speech interruption.wav   # let the server's VAD hear the interruption

Playback is simulated with the wall clock from the first audio delta. After `--interrupt-ms` of
playback the user interrupts: by default the app itself cancels the response (as it would when its
own VAD fires); with `--speech` the file is streamed at real time and the server's VAD cancels
the response (`turn_detected`) and answers the new turn. Either way the app then truncates the
interrupted item to what was actually played, so the conversation matches what the user heard.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np
from _common import add_connection_args, serve_if_needed

from realtime_ming.protocol import (
    ConversationItemTruncated,
    ResponseDone,
    ResponseOutputAudioDelta,
    ResponseOutputItemAdded,
    ServerEvent,
)
from realtime_ming.sdk import RealtimeAgent, RealtimeClient, read_audio_file


async def play_until_interrupt(agent: RealtimeAgent, interrupt_ms: float) -> tuple[str | None, float] | None:
    """Read the reply until `interrupt_ms` of it has played; (item id, played ms), or None when the
    reply ended first. Audio arrives as 16-bit PCM at the session rate."""
    loop = asyncio.get_running_loop()
    rate_hz = agent.session.output_format.sample_rate_hz
    item_id, received_ms, deadline = None, 0.0, None
    while True:
        remaining = None if deadline is None else max(0.0, deadline - loop.time())
        try:
            async with asyncio.timeout(remaining):
                event = await agent.recv()
        except TimeoutError:
            return item_id, min(received_ms, interrupt_ms)
        if isinstance(event, ResponseOutputItemAdded):
            item_id = event.item.id
        elif isinstance(event, ResponseOutputAudioDelta):
            deadline = deadline or loop.time() + interrupt_ms / 1000
            received_ms += len(event.delta) * 3 / 4 / 2 / rate_hz * 1000  # base64 → bytes → samples → ms
        elif isinstance(event, ResponseDone):
            return None


async def read_until(agent: RealtimeAgent, kind: type[ServerEvent]) -> ServerEvent:
    """Events up to the first of `kind` (returned)."""
    async for event in agent:
        print(f"  <- {event.type}")
        if isinstance(event, kind):
            return event
    raise RuntimeError("session ended")


async def main(args: argparse.Namespace) -> int:
    async with (
        serve_if_needed(args.url) as url,
        RealtimeClient.connect(url, api_key=args.api_key, model=args.model, beta=args.beta) as client,
    ):
        if args.speech is None:  # the app decides when the user speaks
            await client.update_session(turn_detection=None, max_output_tokens=args.max_output_tokens)
        else:
            await client.update_session(max_output_tokens=args.max_output_tokens)
        await client.add_text("Please tell me a long story about the sea.")
        await client.create_response()
        heard = await play_until_interrupt(client, args.interrupt_ms)
        if heard is None:
            print("the reply ended before the interruption point; nothing to interrupt")
            return 0
        item_id, played_ms = heard
        print(f"user interrupts after {played_ms:.0f} ms of playback")
        if args.speech is None:
            await client.cancel()
            streaming = None
        else:  # the server hears the user (1 s of silence ends the turn) and cancels the response
            speech = np.concatenate([read_audio_file(args.speech, 16000), np.zeros(16000, np.float32)])
            streaming = asyncio.create_task(client.send_audio(speech, sample_rate_hz=16000, realtime=True))
        done = await read_until(client, ResponseDone)
        assert isinstance(done, ResponseDone)
        reason = done.response.status_details.reason if done.response.status_details else None
        print(f"response {done.response.status.value} ({reason.value if reason else 'no reason'})")
        if item_id is not None:
            await client.truncate(item_id, audio_end_ms=int(played_ms))
            truncated = await read_until(client, ConversationItemTruncated)
            assert isinstance(truncated, ConversationItemTruncated)
            print(f"item {truncated.item_id} truncated at {truncated.audio_end_ms} ms")
        if streaming is not None:
            await streaming
            turn = await client.collect_turn()
            print(f"answer to the interruption: {turn.status.value}, {turn.duration_s:.2f} s of audio")
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(parser)
    parser.add_argument("--interrupt-ms", type=float, default=300.0, help="playback before the interruption")
    parser.add_argument("--speech", type=Path, help="a recording of the interruption (server VAD barge-in)")
    parser.add_argument("--max-output-tokens", type=int, default=48)
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
