"""Ask about a short video clip: one user message with the clip and a question, answered in text or speech.

    python examples/video_turn.py --url ws://127.0.0.1:8000/v1/realtime --video clip.mp4 --question "What happens?"
    python examples/video_turn.py --frames a.jpg b.jpg c.jpg --fps 1    # stills shown one second each
    python examples/video_turn.py                     # serves the tiny model itself, sends a generated clip

The clip travels as an `input_video` part (a realtime_ming extension, GA dialect only): a video file
as a `data:video/...` URL (the server decodes it with its `video` extra, PyAV), or frames as image
data URLs with timestamps. The server samples it as Ming does (2 frames per second). `--text` asks
for a text answer.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np
from _common import add_connection_args, add_question_args, ask_about


def moving_square(seconds: float = 3.0, fps: float = 10.0, size: int = 96) -> list[np.ndarray]:
    """A white square crossing a dark blue frame left to right: [size, size, 3] uint8 frames."""
    frames = []
    count = int(seconds * fps)
    side = size // 4
    for k in range(count):
        frame = np.zeros((size, size, 3), dtype=np.uint8)
        frame[..., 2] = 96
        x = int((size - side) * k / max(count - 1, 1))
        frame[size // 2 - side // 2 : size // 2 + side // 2, x : x + side] = 255
        frames.append(frame)
    return frames


async def main(args: argparse.Namespace) -> int:
    async def send(client) -> tuple[str, str]:
        if args.video is not None:
            return await client.add_video(args.video, text=args.question), f"video file {args.video.name}"
        frames = args.frames or moving_square(fps=args.fps)
        item_id = await client.add_video(frames, fps=args.fps, text=args.question)
        return item_id, f"{len(frames)} frames at {args.fps:g} fps"

    return await ask_about(args, send)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--video", type=Path, help="video file (mp4, webm, ...; the server needs its 'video' extra)")
    source.add_argument("--frames", type=Path, nargs="+", help="image files, one frame each (default: a generated clip)")
    parser.add_argument("--fps", type=float, default=10.0, help="frame rate of --frames or the generated clip")
    add_question_args(parser, "What happens in this video?", "video_answer.wav")
    args = parser.parse_args()
    if args.beta:
        parser.error("video needs the GA dialect")
    if args.fps <= 0:
        parser.error("--fps must be > 0")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
