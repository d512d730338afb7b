"""What the agent's calls take, turned into protocol values: an image (path, encoded bytes, array, PIL image) into a
`data:image/...` URL, a clip or a sequence of frames into an `input_video` part, the modality and audio-format
shorthands (`"text"`, `24000`) into their types. Plain functions: `RealtimeAgent` runs the file reads and encodes
off the event loop."""

from __future__ import annotations

import base64
import io
import mimetypes
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..protocol.items import InputVideo, VideoFrame
from ..protocol.values import AudioEncoding, AudioFormat, Modality

__all__ = ["audio_format", "image_data_url", "modalities", "video_part"]


def modalities(value: str | Modality | Sequence[str | Modality]) -> tuple[Modality, ...]:
    """`"audio"` or `"text"` (or a sequence of them) -> `Modality` values."""
    names = (value,) if isinstance(value, str) else tuple(value)
    return tuple(Modality(name) for name in names)


def audio_format(value: AudioFormat | int) -> AudioFormat:
    """An `AudioFormat`, or an int meaning PCM16 at that rate (16000, 24000 or 44100)."""
    return value if isinstance(value, AudioFormat) else AudioFormat(AudioEncoding.PCM, int(value))


def image_data_url(image: Any) -> str:
    """Path, encoded image bytes, an [H, W, 3] uint8 array or a PIL image → `data:image/...;base64,`."""
    from PIL import Image

    if isinstance(image, str | os.PathLike):
        with open(image, "rb") as handle:
            image = handle.read()
    if isinstance(image, bytes | bytearray | memoryview):
        data = bytes(image)
        with Image.open(io.BytesIO(data)) as probe:
            kind = (probe.format or "png").lower()
    else:
        picture = Image.fromarray(np.asarray(image, dtype=np.uint8)) if isinstance(image, np.ndarray) else image
        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        data, kind = buffer.getvalue(), "png"
    return f"data:image/{kind};base64,{base64.b64encode(data).decode('ascii')}"


def video_part(video: Any, fps: float | None, timestamps_s: Sequence[float] | None, mime_type: str | None) -> InputVideo:
    """A clip → `input_video`: a file path or encoded bytes become a `data:video/...` URL; a sequence of
    frames (anything `add_image` takes) becomes timed image frames (`timestamps_s`, or `k / fps`)."""
    if isinstance(video, str | os.PathLike | bytes | bytearray | memoryview):
        if timestamps_s is not None or fps is not None:
            raise ValueError("fps / timestamps_s apply to a sequence of frames, not to a video file")
        if isinstance(video, str | os.PathLike):
            mime_type = mime_type or mimetypes.guess_type(os.fspath(video))[0]
            with open(video, "rb") as handle:
                video = handle.read()
        mime_type = mime_type or "video/mp4"
        if not mime_type.startswith("video/"):
            raise ValueError(f"not a video type: {mime_type!r}")
        return InputVideo(video_url=f"data:{mime_type};base64,{base64.b64encode(bytes(video)).decode('ascii')}")
    frames = list(video)
    if (timestamps_s is None) == (fps is None):
        raise ValueError("give exactly one of fps and timestamps_s for a sequence of frames")
    stamps = [float(t) for t in timestamps_s] if timestamps_s is not None else [k / fps for k in range(len(frames))]
    if len(stamps) != len(frames):
        raise ValueError(f"{len(frames)} frames but {len(stamps)} timestamps")
    return InputVideo(frames=tuple(VideoFrame(image_data_url(f), t) for f, t in zip(frames, stamps)))
