"""Vision pre-processing: images / decoded video frames → ViT patch rows (docs/model.md §3.2).

uint8 RGB → `smart_resize` (multiples of 32) → Pillow bicubic → rescale 1/255, CLIP mean/std →
frame pairs (a still image repeated) → pixel_values [t·h·w, 1536] float32 in merge-block order plus
grid (t, h, w); reproduces [MING] `BailingMM2ImageProcessor` (video sampling: V1 `fetch_video`).
The sizes and frame picks live in `vision_geometry` (torch-free) and are re-exported here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .config import PreprocessorConfig
from .vision_geometry import (
    MAX_ASPECT_RATIO,
    VideoSampling,
    resize_bicubic,
    smart_resize,
    video_frame_indices,
    video_frame_size,
    video_grid_indices,
)

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


def _to_rgb_uint8(image) -> np.ndarray:
    """PIL image (any mode, converted to RGB) or uint8 numpy [H, W, 3] → uint8 [H, W, 3]."""
    if isinstance(image, Image.Image):
        return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"expected a uint8 RGB array [H, W, 3], got {array.dtype} {array.shape}")
    return array


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
