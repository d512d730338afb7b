"""Vision pre-processing: images / decoded video frames → ViT patch rows (docs/model.md §3.2).

uint8 RGB → `smart_resize` (multiples of 32) → Pillow bicubic → rescale 1/255, CLIP mean/std →
frame pairs (a still image repeated) → pixel_values [t·h·w, 1536] float32 in merge-block order plus
grid (t, h, w); reproduces [MING] `BailingMM2ImageProcessor` (video sampling: V1 `fetch_video`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .config import PreprocessorConfig

__all__ = [
    "MAX_ASPECT_RATIO",
    "VideoSampling",
    "VisionInput",
    "smart_resize",
    "resize_bicubic",
    "normalize_pixels",
    "patchify",
    "preprocess_image",
    "image_grid",
    "video_frame_indices",
    "video_frame_size",
    "video_grid_indices",
    "preprocess_video",
    "batch_vision_inputs",
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


@dataclass(frozen=True)
class VisionInput:
    """One image or video ready for the ViT."""

    pixel_values: torch.Tensor  # [t·h·w, C·T·P·P] float32, rows in (t, h_block, w_block, h_in, w_in) order
    grid_thw: tuple[int, int, int]  # (temporal groups, patch rows, patch columns)
    resized_hw: tuple[int, int]  # pixel size the frames were resized to

    @property
    def num_patches(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w


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


def _to_rgb_uint8(image) -> np.ndarray:
    """PIL image (any mode, converted to RGB) or uint8 numpy [H, W, 3] → uint8 [H, W, 3]."""
    if isinstance(image, Image.Image):
        return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"expected a uint8 RGB array [H, W, 3], got {array.dtype} {array.shape}")
    return array


def resize_bicubic(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 [H, W, 3] → uint8 [height, width, 3] with Pillow BICUBIC (`reducing_gap=None`).

    Same call as `transformers.image_transforms.resize` on a uint8 image; a same-size resize
    returns the pixels unchanged.
    """
    resized = Image.fromarray(image).resize((width, height), resample=Image.Resampling.BICUBIC, reducing_gap=None)
    return np.asarray(resized)


def normalize_pixels(frames: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """uint8 [..., 3] → float32: x·(1/255) in float64 cast to float32, then (x − mean)/std in float32.

    The dtype steps of transformers' `rescale` and `normalize`, so results match bit for bit.
    """
    scaled = (frames.astype(np.float64) * (1 / 255)).astype(np.float32)
    return (scaled - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)


def patchify(frames: np.ndarray, patch_size: int = 16, temporal_patch_size: int = 2,
             merge_size: int = 2) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Normalised frames [T, H, W, C] (T a multiple of temporal_patch_size) → ([t·h·w, C·T·P·P], grid).

    Rows ordered (t, h_block, w_block, h_in_block, w_in_block); columns (c, t_in, row, col).
    """
    n, height, width, channels = frames.shape
    if n % temporal_patch_size:
        raise ValueError(f"{n} frames is not a multiple of temporal_patch_size {temporal_patch_size}")
    side = patch_size * merge_size
    if height % side or width % side:
        raise ValueError(f"frame size {height}x{width} is not a multiple of {side}")
    t, h, w = n // temporal_patch_size, height // patch_size, width // patch_size
    x = frames.reshape(t, temporal_patch_size, h // merge_size, merge_size, patch_size,
                       w // merge_size, merge_size, patch_size, channels)
    # axes: 0 t, 1 t_in, 2 hb, 3 hi, 4 ph, 5 wb, 6 wi, 7 pw, 8 c
    x = x.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
    return np.ascontiguousarray(x).reshape(t * h * w, -1), (t, h, w)


def _frames_to_input(frames: np.ndarray, cfg: PreprocessorConfig) -> VisionInput:
    """Resized uint8 frames [T, H, W, 3] → VisionInput (a single frame is repeated to fill a group)."""
    pixels = normalize_pixels(frames, cfg.image_mean, cfg.image_std)
    if pixels.shape[0] == 1:
        pixels = np.repeat(pixels, cfg.temporal_patch_size, axis=0)
    rows, grid = patchify(pixels, cfg.patch_size, cfg.temporal_patch_size, cfg.merge_size)
    return VisionInput(torch.from_numpy(rows), grid, (frames.shape[1], frames.shape[2]))


def preprocess_image(image, cfg: PreprocessorConfig = PreprocessorConfig()) -> VisionInput:
    """One image (PIL or uint8 numpy HWC RGB) → VisionInput, as `BailingMM2ImageProcessor.preprocess`."""
    array = _to_rgb_uint8(image)
    height, width = smart_resize(array.shape[0], array.shape[1], cfg.patch_size * cfg.merge_size,
                                 cfg.min_pixels, cfg.max_pixels)
    resized = resize_bicubic(array, height, width)
    return _frames_to_input(resized[None], cfg)


def image_grid(height: int, width: int, cfg: PreprocessorConfig = PreprocessorConfig()) -> tuple[int, int, int]:
    """The (t, h, w) patch grid `preprocess_image` gives an image of this size, without touching a pixel."""
    h, w = smart_resize(height, width, cfg.patch_size * cfg.merge_size, cfg.min_pixels, cfg.max_pixels)
    return 1, h // cfg.patch_size, w // cfg.patch_size


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


def preprocess_video(frames, video_fps: float, cfg: PreprocessorConfig = PreprocessorConfig(),
                     sampling: VideoSampling = VideoSampling()) -> tuple[VisionInput, list[int]]:
    """Decoded frames (uint8 [N, H, W, 3] array or a list of frames/PIL images) → (VisionInput, kept indices).

    Samples frames (`video_frame_indices`), resizes each to the per-frame budget size, pads the
    count to a multiple of frame_factor by repeating the last frame, then normalises and
    patchifies like an image. The reference resizes with OpenCV INTER_CUBIC; Pillow bicubic is
    used here, so resized pixels may differ by small amounts (no video fixture exists).
    """
    frames = list(frames)
    if not frames:
        raise ValueError("a video needs at least one frame")
    indices = video_frame_indices(len(frames), video_fps, sampling)
    kept = [_to_rgb_uint8(frames[i]) for i in indices]
    if any(f.shape != kept[0].shape for f in kept):
        raise ValueError("all video frames must have the same size")
    height, width = video_frame_size(kept[0].shape[0], kept[0].shape[1], len(kept), sampling,
                                     cfg.patch_size * cfg.merge_size)
    resized = [resize_bicubic(f, height, width) for f in kept]
    pad = -len(resized) % sampling.frame_factor
    resized += [resized[-1]] * pad
    return _frames_to_input(np.stack(resized), cfg), indices


def batch_vision_inputs(inputs: Sequence[VisionInput]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate several inputs for one ViT call: (pixel_values [Σ patches, 1536], grid_thw [n, 3] int64)."""
    if not inputs:
        raise ValueError("no vision inputs")
    pixels = torch.cat([x.pixel_values for x in inputs])
    grids = torch.tensor([x.grid_thw for x in inputs], dtype=torch.long)
    return pixels, grids
