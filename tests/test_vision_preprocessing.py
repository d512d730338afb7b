"""Vision pre-processing (docs/model.md §3.2) against the `vision` fixture and the documented rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.image_processing import (
    VideoSampling,
    batch_vision_inputs,
    patchify,
    preprocess_image,
    preprocess_video,
    resize_bicubic,
    smart_resize,
    video_frame_indices,
    video_frame_size,
)

PIXEL_TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def case(load_case):
    return load_case("vision")


@pytest.fixture(scope="module")
def pre_cfg(fixture_root):
    return load_checkpoint_config(fixture_root).preprocessor


def test_fixture_resized_uint8_exact(case, pre_cfg):
    """smart_resize + Pillow bicubic give the reference's resized uint8 images bit for bit."""
    tensors, meta = case
    for i, info in enumerate(meta["images"]):
        raw = tensors[f"image{i}_raw_uint8_hwc"].numpy()
        size = smart_resize(raw.shape[0], raw.shape[1], pre_cfg.patch_size * pre_cfg.merge_size,
                            pre_cfg.min_pixels, pre_cfg.max_pixels)
        assert list(size) == info["resized_hw"]
        resized = resize_bicubic(raw, *size)
        assert np.array_equal(resized, tensors[f"image{i}_resized_uint8_hwc"].numpy())


def test_fixture_pixel_values_and_grid(case, pre_cfg):
    """preprocess_image reproduces image{i}_pixel_values and grid_thw; batching concatenates them."""
    tensors, meta = case
    inputs = []
    for i in range(len(meta["images"])):
        vi = preprocess_image(tensors[f"image{i}_raw_uint8_hwc"].numpy(), pre_cfg)
        torch.testing.assert_close(vi.pixel_values, tensors[f"image{i}_pixel_values"], **PIXEL_TOL)
        assert torch.equal(torch.tensor([vi.grid_thw]), tensors[f"image{i}_grid_thw"])
        inputs.append(vi)
    pixels, grids = batch_vision_inputs(inputs)
    torch.testing.assert_close(pixels, tensors["batched_pixel_values"], **PIXEL_TOL)
    assert torch.equal(grids, tensors["batched_grid_thw"])


def test_fixture_pil_input_equals_numpy_input(case, pre_cfg):
    """A PIL image (RGBA converted to RGB) gives the same pixel values as the uint8 array."""
    raw = case[0]["image1_raw_uint8_hwc"].numpy()
    rgba = Image.fromarray(raw).convert("RGBA")
    assert torch.equal(preprocess_image(rgba, pre_cfg).pixel_values, preprocess_image(raw, pre_cfg).pixel_values)


def test_smart_resize_rules():
    """Nearest multiple of 32; area above max floors, below min ceils; tiny sides and extreme ratios raise."""
    assert smart_resize(100, 150) == (96, 160)
    assert smart_resize(48, 48) == (64, 64)  # round(1.5) == 2 (ties to even)
    assert smart_resize(80, 80) == (64, 64)  # round(2.5) == 2
    assert smart_resize(1000, 2000, max_pixels=200_000) == (288, 608)  # floor after scaling down
    assert smart_resize(40, 40, min_pixels=10_000) == (128, 128)  # ceil after scaling up
    with pytest.raises(ValueError):
        smart_resize(20, 200)
    with pytest.raises(ValueError):
        smart_resize(32, 32 * 201)


def test_patchify_row_and_column_order():
    """Row r of the patches is (t, h_block, w_block, h_in, w_in); column is (c, t_in, row, col)."""
    t_frames, height, width, channels = 4, 64, 96, 3
    frames = np.arange(t_frames * height * width * channels, dtype=np.float32).reshape(t_frames, height, width, channels)
    rows, grid = patchify(frames)
    assert grid == (2, 4, 6)
    t, hb, wb, hi, wi = 1, 1, 2, 1, 0  # patch row 3, patch column 4 of temporal group 1
    row = ((t * 2 + hb) * 3 + wb) * 4 + hi * 2 + wi
    c, t_in, y, x = 2, 1, 5, 7
    col = ((c * 2 + t_in) * 16 + y) * 16 + x
    expected = frames[2 * t + t_in, (2 * hb + hi) * 16 + y, (2 * wb + wi) * 16 + x, c]
    assert rows[row, col] == expected
    assert rows.shape == (2 * 4 * 6, 3 * 2 * 16 * 16)


def test_single_image_is_repeated_to_two_frames(pre_cfg):
    """A still image fills both temporal slots: the two t_in halves of every channel block are equal."""
    image = np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    vi = preprocess_image(image, pre_cfg)
    assert vi.grid_thw == (1, 4, 6)
    blocks = vi.pixel_values.view(vi.num_patches, 3, 2, -1)
    assert torch.equal(blocks[:, :, 0], blocks[:, :, 1])


def test_video_frame_indices():
    """Duration x 2 fps frames spread evenly, at least min_frames, at most max_frames and the available frames."""
    assert video_frame_indices(50, 10.0) == [0, 5, 10, 16, 21, 27, 32, 38, 43, 49]  # 5 s -> 10 frames
    assert video_frame_indices(10, 30.0) == [0, 3, 6, 9]  # 0.33 s -> raised to min_frames 4
    assert video_frame_indices(3, 1.0) == [0, 1, 2]  # never more than the available frames
    long = video_frame_indices(1000, 1.0)
    assert len(long) == 256 and long[0] == 0 and long[-1] == 999
    assert video_frame_indices(10, 30.0, VideoSampling(min_frames=1)) == [0]  # exact V1 sampler


def test_video_frame_size_budget():
    """The per-frame pixel budget shrinks with the frame count but never below 1.05 x min_pixels."""
    assert video_frame_size(480, 640, 4) == (480, 640)
    assert video_frame_size(480, 640, 256) == (320, 416)
    height, width = video_frame_size(480, 640, 256)
    assert height * width <= int(VideoSampling().min_pixels * 1.05)


def test_preprocess_video_pads_to_whole_groups(pre_cfg):
    """Five sampled frames are padded to six by repeating the last; grid t counts frame pairs."""
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (10, 64, 96, 3), dtype=np.uint8)
    sampling = VideoSampling(min_pixels=4096, total_pixels=64 * 96 * 5)
    vi, kept = preprocess_video(frames, 4.0, pre_cfg, sampling)  # 2.5 s -> 5 frames
    assert kept == [0, 2, 4, 6, 9]
    assert vi.grid_thw == (3, 4, 6) and vi.resized_hw == (64, 96)
    groups = vi.pixel_values.view(3, 4 * 6, 3, 2, -1)
    assert torch.equal(groups[2, :, :, 0], groups[2, :, :, 1])
    assert not torch.equal(groups[1, :, :, 0], groups[1, :, :, 1])
    still = preprocess_image(frames[9], pre_cfg).pixel_values
    assert torch.equal(vi.pixel_values[2 * 24:], still)


def test_rejects_non_uint8_arrays(pre_cfg):
    """Float or single-channel arrays raise ValueError (inputs are uint8 RGB)."""
    with pytest.raises(ValueError, match="uint8 RGB"):
        preprocess_image(np.zeros((64, 64, 3), dtype=np.float32), pre_cfg)
    with pytest.raises(ValueError, match="uint8 RGB"):
        preprocess_image(np.zeros((64, 64), dtype=np.uint8), pre_cfg)
