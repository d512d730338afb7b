"""Vision geometry: the sizes and frame picks of Ming's image and video pre-processing, without pixels' tensors.

What a front end needs to check and shrink media before a turn (the session's decoders, through `engine.api`) and
what `image_processing` builds the ViT input with: `smart_resize` (multiples of 32, pixel budget), Pillow bicubic
`resize_bicubic`, and the video sampling (`VideoSampling`, `video_frame_indices`, `video_grid_indices`,
`video_frame_size`); reproduces [MING] `BailingMM2ImageProcessor` and V1 `fetch_video`. numpy only (Pillow on
first resize): importing it loads no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "MAX_ASPECT_RATIO",
    "VideoSampling",
    "resize_bicubic",
    "smart_resize",
    "video_frame_indices",
    "video_frame_size",
    "video_grid_indices",
]

MAX_ASPECT_RATIO = 200


@dataclass(frozen=True, slots=True)
class VideoSampling:
    """Frame sampling and per-frame pixel budget for video (`bailingmm_utils_video.py` V1 constants)."""

    fps: float = 2.0  # frames sampled per second of video
    min_frames: int = 4  # docs/model.md §3.2; the released V1 sampler has no minimum (min_frames=1 = exact V1)
    max_frames: int = 256
    frame_factor: int = 2  # frame count padded to a multiple of this (= temporal_patch_size)
    min_pixels: int = 128 * 32 * 32  # VIDEO_MIN_PIXELS
    total_pixels: int = 96 * 128 * 32 * 32  # VIDEO_TOTAL_PIXELS, spread over the sampled frames

    def __post_init__(self):
        if self.fps <= 0:
            raise ValueError(f"fps must be > 0, got {self.fps}")
        if not 1 <= self.min_frames <= self.max_frames:
            raise ValueError(f"need 1 <= min_frames <= max_frames, got {self.min_frames}, {self.max_frames}")
        if self.frame_factor < 1:
            raise ValueError(f"frame_factor must be >= 1, got {self.frame_factor}")


def smart_resize(height: int, width: int, factor: int = 32, min_pixels: int = 4096,
                 max_pixels: int = 16777216) -> tuple[int, int]:
    """Target (height, width): multiples of `factor`, area within [min_pixels, max_pixels], aspect kept.

    Nearest multiple first (Python `round`, ties to even); if the area exceeds `max_pixels` both
    sides are scaled down and floored, if below `min_pixels` scaled up and ceiled ([MING]
    `image_processing_bailingmm2.smart_resize`). Raises ValueError for a side below `factor` or
    an aspect ratio above 200.
    """
    if height < factor or width < factor:
        raise ValueError(f"image {height}x{width} is smaller than {factor} pixels on a side")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio of {height}x{width} exceeds {MAX_ASPECT_RATIO}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def resize_bicubic(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 [H, W, 3] → uint8 [height, width, 3] with Pillow BICUBIC (`reducing_gap=None`).

    Same call as `transformers.image_transforms.resize` on a uint8 image; a same-size resize
    returns the pixels unchanged.
    """
    from PIL import Image  # here: the front ends import this module without loading Pillow

    resized = Image.fromarray(image).resize((width, height), resample=Image.Resampling.BICUBIC, reducing_gap=None)
    return np.asarray(resized)


def video_frame_indices(total_frames: int, video_fps: float, sampling: VideoSampling = VideoSampling()) -> list[int]:
    """Indices of the frames to keep: duration·fps frames, spread evenly (`np.linspace`, truncated).

    Count = duration·fps clamped to [min_frames, max_frames (floored to frame_factor)] and to the
    available frames (V1 `v1_smart_nframes`; see VideoSampling.min_frames). Not padded here.
    """
    if total_frames < 1 or video_fps <= 0:
        raise ValueError(f"need total_frames >= 1 and video_fps > 0, got {total_frames}, {video_fps}")
    factor = sampling.frame_factor
    max_frames = max(1, min(sampling.max_frames, total_frames) // factor * factor)
    count = max(1.0, total_frames / video_fps * sampling.fps)
    count = max(min(count, max_frames, total_frames), min(sampling.min_frames, total_frames))
    return np.linspace(0, total_frames - 1, int(count), dtype=int).tolist()


def video_frame_size(height: int, width: int, num_frames: int, sampling: VideoSampling = VideoSampling(),
                     factor: int = 32) -> tuple[int, int]:
    """Per-frame target size: `smart_resize` within a budget of total_pixels / num_frames · frame_factor."""
    max_pixels = max(sampling.total_pixels / num_frames * sampling.frame_factor, int(sampling.min_pixels * 1.05))
    return smart_resize(height, width, factor, sampling.min_pixels, max_pixels)


def video_grid_indices(timestamps_s: Sequence[float], sampling: VideoSampling = VideoSampling()) -> list[int]:
    """Frames of a timed clip at the sampling rate: index of the frame shown at each `t0 + k / fps`.

    The clip lasts from its first timestamp to its last plus one mean frame interval (a single
    frame: `1 / fps`), as V1 counts `total_frames / video_fps` seconds. The count is V1's
    `duration * fps` (truncated, at least `min(min_frames, len)`), rounded up to a multiple of
    `frame_factor` (V1 pads with the last frame; a grid point past the end holds the last frame,
    which is the same). On this uniform grid `preprocess_video(frames, sampling.fps)` keeps every
    frame and stamps frame pair k with `k · frame_factor / fps` seconds, so the timestamps the
    model reads are the clip's own. Raises ValueError for no frames, decreasing timestamps, or a
    clip needing more than `max_frames` frames.
    """
    stamps = np.asarray(timestamps_s, dtype=np.float64)
    if stamps.ndim != 1 or stamps.size < 1:
        raise ValueError("a clip needs at least one timestamp")
    if np.any(np.diff(stamps) <= 0) or not np.all(np.isfinite(stamps)):
        raise ValueError("frame timestamps must be finite and increase strictly")
    interval = (stamps[-1] - stamps[0]) / (stamps.size - 1) if stamps.size > 1 else 1.0 / sampling.fps
    duration = stamps[-1] - stamps[0] + interval
    count = max(1, int(duration * sampling.fps + 1e-6), min(sampling.min_frames, stamps.size))
    count = -(-count // sampling.frame_factor) * sampling.frame_factor
    if count > sampling.max_frames:
        raise ValueError(f"a clip of {duration:.2f} s needs {count} frames at {sampling.fps:g} fps,"
                         f" more than {sampling.max_frames}")
    grid = stamps[0] + np.arange(count) / sampling.fps
    return (np.searchsorted(stamps, grid + 1e-6, side="right") - 1).tolist()
