"""Ask about an image: one user message with an image and a question, answered in text or speech.

    python examples/image_turn.py --url ws://127.0.0.1:8000/v1/realtime --image photo.jpg --question "What is this?"
    python examples/image_turn.py                    # serves the tiny model itself, sends a generated picture

Images travel as `input_image` data URLs (GA dialect only). `--text` asks for a text answer.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np
from _common import add_connection_args, add_question_args, ask_about


def gradient_picture(size: int = 64) -> np.ndarray:
    """A red-to-blue gradient with a white square: [size, size, 3] uint8."""
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    picture = np.stack([np.tile(ramp[::-1], (size, 1)), np.full((size, size), 64.0), np.tile(ramp, (size, 1))], -1)
    picture[size // 4 : size // 2, size // 4 : size // 2] = 255
    return picture.astype(np.uint8)


async def main(args: argparse.Namespace) -> int:
    image = args.image if args.image is not None else gradient_picture()

    async def send(client) -> tuple[str, str]:
        what = f"image file {args.image.name}" if args.image is not None else "a generated picture"
        return await client.add_image(image, text=args.question), what

    return await ask_about(args, send)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(parser)
    parser.add_argument("--image", type=Path, help="image file (default: a generated gradient)")
    add_question_args(parser, "What do you see in this picture?", "image_answer.wav")
    args = parser.parse_args()
    if args.beta:
        parser.error("images need the GA dialect")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
