"""Encoded test media: solid-colour frames as JPEG and short MP4 clips."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest


def _jpeg(rgb: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")  # lossless: pixel values survive for the order check
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _solid(value: int, size: tuple[int, int] = (64, 96)) -> np.ndarray:
    return np.full((*size, 3), value, dtype=np.uint8)


def _mp4(frames: list[np.ndarray], fps: int) -> bytes:
    av = pytest.importorskip("av")  # the `video` extra; part of the test extra
    buffer = io.BytesIO()
    height, width = frames[0].shape[:2]
    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for rgb in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
        out.mux(stream.encode())
    return buffer.getvalue()
