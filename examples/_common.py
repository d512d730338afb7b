"""Shared by the examples: command-line options and an in-process tiny server when no --url is given.

The embedded tiny model has random weights, so its own words are byte noise that the talker
cannot speak. When an example serves it itself, the thinker is told to emit a fixed demo reply
(the `forced_reply` hook, `realtime_ming/engine/hooks.py`; every model stage still runs) so that there is
audio to save.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.sdk import RealtimeClient

__all__ = ["TINY_DEMO_REPLY", "add_connection_args", "add_question_args", "ask_about", "demo_tone", "serve_if_needed",
           "tiny_demo_hooks"]

TINY_DEMO_REPLY = "Hello! This is the tiny demo model speaking. It has random weights."


def tiny_demo_hooks() -> EngineHooks:
    """The embedded tiny CPU model's demo hooks: it answers with `TINY_DEMO_REPLY`."""
    return EngineHooks(forced_reply=TINY_DEMO_REPLY)


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    """--url / --api-key / --model / --beta."""
    parser.add_argument("--url", help="server, e.g. ws://127.0.0.1:8000/v1/realtime (default: serve the tiny model here)")
    parser.add_argument("--api-key", default=None, help="API key, if the server requires one")
    parser.add_argument("--model", default=None, help="model id for the ?model= query")
    parser.add_argument("--beta", action="store_true", help="speak the beta dialect")


def add_question_args(parser: argparse.ArgumentParser, question: str, output: str) -> None:
    """--question / --text / --output / --max-output-tokens of the examples that ask about an image or a clip."""
    parser.add_argument("--question", default=question)
    parser.add_argument("--text", action="store_true", help="answer in text instead of speech")
    parser.add_argument("--output", type=Path, default=Path(output))
    parser.add_argument("--max-output-tokens", type=int, default=32)


async def ask_about(args: argparse.Namespace, send: Callable[..., Awaitable[tuple[str, str]]]) -> int:
    """One manual turn about media: connect (serving the tiny model if no --url), `await send(client)` adds the
    user item and says what it sent (item id, description), then the text or spoken answer is printed / saved."""
    async with (
        serve_if_needed(args.url) as url,
        RealtimeClient.connect(url, api_key=args.api_key, model=args.model) as client,
    ):
        await client.update_session(turn_detection=None, max_output_tokens=args.max_output_tokens)
        item_id, what = await send(client)
        await client.create_response(output_modalities="text" if args.text else "audio")
        turn = await client.collect_turn()
    print(f"sent {what} as item {item_id}; answer {turn.status.value}: {turn.text!r}")
    if turn.audio.size:
        print(f"spoken answer: {turn.duration_s:.2f} s -> {turn.save_wav(args.output)}")
    return 0


@asynccontextmanager
async def serve_if_needed(url: str | None) -> AsyncIterator[str]:
    """Yield `url`, or start the tiny model behind a loopback server and yield its URL."""
    if url:
        yield url
        return
    from realtime_ming.engine import Engine
    from realtime_ming.engine.config import EngineConfig
    from realtime_ming.server import RealtimeServer, load_config

    print("no --url: serving the embedded tiny random-weight model in-process", file=sys.stderr)
    engine = await asyncio.to_thread(lambda: Engine.create(EngineConfig(), hooks=tiny_demo_hooks()))
    try:
        async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as server:
            yield f"ws://127.0.0.1:{server.port}/v1/realtime"
    finally:
        await asyncio.to_thread(engine.close)


def demo_tone(seconds: float = 1.0, rate_hz: int = 16000) -> np.ndarray:
    """A voiced-sounding test signal (200 Hz with harmonics, syllable-like envelope), float32."""
    t = np.arange(round(seconds * rate_hz)) / rate_hz
    voice = sum(np.sin(2 * np.pi * 200 * k * t) / k for k in range(1, 6))
    envelope = 0.5 - 0.5 * np.cos(2 * np.pi * 4 * t)
    return (0.2 * voice * envelope).astype(np.float32)
