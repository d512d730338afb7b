"""Video containers (`input_video` `video_url`) read with PyAV, the optional `video` extra.

Two passes over the bytes, both bounded before any pixel is decoded: `probe` demuxes packets only
(no decoding) to learn the frame size and every frame's timestamp, rejecting a container without
a video stream, over the pixel budget, longer than the time budget or with more packets than
`max_frames_decoded`; `decode_frames` then decodes in order and hands over only the wanted frames
as RGB arrays, one at a time, so memory holds one full-size frame at a time. Every failure is a
`ProtocolError` (`video_decoder_unavailable`, `invalid_video`, `video_too_long`,
`image_too_large`) with the param path.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError

__all__ = ["ContainerProbe", "decode_frames", "probe"]

# Packets read from one container at most (a 60 s clip at 120 fps): bounds the demux work of a
# crafted file whose packets are tiny.
MAX_PACKETS = 7200


@dataclass(frozen=True, slots=True)
class ContainerProbe:
    """What the demuxer says: frame size and the presentation time of each frame, in order."""

    width: int
    height: int
    timestamps_s: tuple[float, ...]


def _av(param: str):
    try:
        import av
    except ImportError as exc:
        raise ProtocolError(ErrorCode.VIDEO_DECODER_UNAVAILABLE, param=param) from exc
    return av


def _invalid(param: str, exc: BaseException | str) -> ProtocolError:
    detail = exc if isinstance(exc, str) else (str(exc) or type(exc).__name__)
    return ProtocolError(ErrorCode.INVALID_VIDEO, param=param, detail=detail)


def _open(av, data: bytes, param: str):
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise _invalid(param, exc) from exc
    if not container.streams.video:
        container.close()
        raise _invalid(param, "the container has no video stream")
    return container


def probe(data: bytes, param: str, *, max_pixels: int, max_s: float) -> ContainerProbe:
    """Frame size and timestamps from the container's headers and packets; nothing is decoded."""
    av = _av(param)
    container = _open(av, data, param)
    try:
        stream = container.streams.video[0]
        width, height = int(stream.codec_context.width or 0), int(stream.codec_context.height or 0)
        if width < 1 or height < 1:
            raise _invalid(param, "the video stream has no frame size")
        if width * height > max_pixels:
            raise ProtocolError(ErrorCode.IMAGE_TOO_LARGE, param=param, width=width, height=height,
                                max_pixels=max_pixels)
        base = stream.time_base
        stamps: list[float] = []
        for packet in container.demux(stream):
            if packet.pts is None or packet.size == 0:
                continue
            stamps.append(float(packet.pts * base))
            if len(stamps) > MAX_PACKETS:
                raise _invalid(param, f"more than {MAX_PACKETS} frames")
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise _invalid(param, exc) from exc
    finally:
        container.close()
    if not stamps:
        raise _invalid(param, "the video stream has no frames")
    stamps.sort()
    unique = tuple(dict.fromkeys(stamps))
    if unique[-1] - unique[0] > max_s:
        raise ProtocolError(ErrorCode.VIDEO_TOO_LONG, param=param, duration_s=unique[-1] - unique[0], max_s=max_s)
    return ContainerProbe(width, height, unique)


def decode_frames(data: bytes, param: str, probed: ContainerProbe, wanted: set[int],
                  on_frame: Callable[[int, np.ndarray], None]) -> None:
    """Decode in order; call `on_frame(index, rgb [H, W, 3] uint8)` for each wanted frame index
    (indices into `probed.timestamps_s`). A wanted frame the decoder never produced is an error."""
    av = _av(param)
    index_of = {stamp: i for i, stamp in enumerate(probed.timestamps_s)}
    container = _open(av, data, param)
    seen: set[int] = set()
    try:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            i = index_of.get(float(frame.pts * stream.time_base))
            if i is None or i not in wanted or i in seen:
                continue
            if (frame.width, frame.height) != (probed.width, probed.height):
                raise _invalid(param, "the frame size changes within the stream")
            seen.add(i)
            on_frame(i, frame.to_ndarray(format="rgb24"))
            if len(seen) == len(wanted):
                break
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise _invalid(param, exc) from exc
    finally:
        container.close()
    if len(seen) != len(wanted):
        raise _invalid(param, f"{len(wanted) - len(seen)} of the sampled frames could not be decoded")
