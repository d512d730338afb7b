"""Vision ViT + projector (docs/model.md §3.3–3.4) against the `vision` fixture."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tower_support import EMBED_TOL, HIDDEN_TOL, load_tower

from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.loader import init_dummy, read_weight_map
from realtime_ming.model.vision import VisionProjector, VisionTransformer, grid_list, num_vision_tokens

CASE = "vision"


def _build(root, dtype=torch.float32):
    return load_tower(root, VisionTransformer, VisionProjector, "vision_config", "vision.", "linear_proj.", dtype)


@pytest.fixture(scope="module")
def model(fixture_root):
    return _build(fixture_root)


@pytest.fixture(scope="module")
def case(load_case):
    return load_case(CASE)


def _image_ids(meta):
    return range(len(meta["images"]))


@torch.no_grad()
def test_fixture_vit_out_and_image_embeds(model, case):
    """Per image, the ViT gives vit_out and the projector image_embeds of the reference."""
    _, vit, projector = model
    tensors, meta = case
    for i in _image_ids(meta):
        out = vit(tensors[f"image{i}_pixel_values"], tensors[f"image{i}_grid_thw"])
        torch.testing.assert_close(out, tensors[f"image{i}_vit_out"], **HIDDEN_TOL)
        torch.testing.assert_close(projector(out), tensors[f"image{i}_image_embeds"], **EMBED_TOL)


@torch.no_grad()
def test_fixture_deepstack_debug_outputs(model, case):
    """return_deepstack=True yields the reference's discarded deepstack features, one per index."""
    cfg, vit, _ = model
    tensors, meta = case
    for i in _image_ids(meta):
        out, deepstack = vit(tensors[f"image{i}_pixel_values"], tensors[f"image{i}_grid_thw"], return_deepstack=True)
        assert len(deepstack) == len(cfg.vision_config.deepstack_visual_indexes)
        for k, feature in enumerate(deepstack):
            torch.testing.assert_close(feature, tensors[f"image{i}_deepstack{k}_out_discarded"], **HIDDEN_TOL)
        torch.testing.assert_close(out, tensors[f"image{i}_vit_out"], **HIDDEN_TOL)


@torch.no_grad()
def test_fixture_batched_images(model, case):
    """Both images in one call reproduce batched_image_embeds and equal the per-image concatenation."""
    _, vit, projector = model
    tensors, meta = case
    batched = projector(vit(tensors["batched_pixel_values"], tensors["batched_grid_thw"]))
    torch.testing.assert_close(batched, tensors["batched_image_embeds"], **EMBED_TOL)
    singles = torch.cat([tensors[f"image{i}_image_embeds"] for i in _image_ids(meta)])
    torch.testing.assert_close(batched, singles, **EMBED_TOL)


@torch.no_grad()
def test_mixed_grids_batch_equals_concatenation(model):
    """A batch of differently sized images and a 2-group video equals running each one alone."""
    cfg, vit, projector = model
    vc = cfg.vision_config
    width = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
    m = vc.spatial_merge_size
    grids = [(1, 2 * m, 3 * m), (2, m, 2 * m), (1, 2 * m, 3 * m), (1, m, m)]
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(t * h * w, width, generator=gen) for t, h, w in grids]
    batched = projector(vit(torch.cat(parts), grids))
    alone = torch.cat([projector(vit(p, [g])) for p, g in zip(parts, grids)])
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-6)
    assert batched.shape[0] == sum(num_vision_tokens(g, m) for g in grids)


@torch.no_grad()
def test_video_frames_attend_only_within_their_frame(model):
    """Changing temporal group 1 of a video leaves group 0's tokens unchanged (per-frame attention)."""
    cfg, vit, _ = model
    vc = cfg.vision_config
    m = vc.spatial_merge_size
    grid = (2, 2 * m, 2 * m)
    per_frame = grid[1] * grid[2]
    width = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
    x = torch.randn(2 * per_frame, width, generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[per_frame:] += 1.0
    a, b = vit(x, [grid]), vit(y, [grid])
    tokens = per_frame // (m * m)
    torch.testing.assert_close(a[:tokens], b[:tokens], rtol=0, atol=0)
    assert (a[tokens:] - b[tokens:]).abs().max() > 1e-3


@torch.no_grad()
def test_patch_embed_linear_equals_conv3d(model, case):
    """The Linear form of patch_embed equals running the checkpoint's Conv3d on the patches."""
    cfg, vit, _ = model
    vc = cfg.vision_config
    pixels = case[0]["image0_pixel_values"]
    weight, bias = vit.patch_embed.proj.weight, vit.patch_embed.proj.bias
    patches = pixels.view(-1, vc.in_channels, vc.temporal_patch_size, vc.patch_size, vc.patch_size)
    conv = F.conv3d(patches, weight, bias, stride=weight.shape[2:]).flatten(1)
    torch.testing.assert_close(vit.patch_embed(pixels), conv, rtol=1e-5, atol=1e-5)


def test_strict_load_keeps_deepstack_and_skips_rotary_buffer(fixture_root, model):
    """Every vision.* checkpoint key (deepstack included) maps to a parameter; inv_freq is not stored."""
    _, vit, _ = model
    keys = {k[len("vision."):] for k in read_weight_map(fixture_root) if k.startswith("vision.")}
    assert set(vit.state_dict()) == keys
    assert any(k.startswith("deepstack_merger_list.") for k in keys)
    head_dim = vit.head_dim
    expected = 1.0 / 10000 ** (torch.arange(0, head_dim // 2, 2, dtype=torch.float32) / (head_dim // 2))
    torch.testing.assert_close(vit.inv_freq, expected, rtol=0, atol=0)


def test_dummy_init_runs(fixture_root):
    """A dummy-initialised ViT (no checkpoint) builds its buffers and produces finite unit-norm embeddings."""
    cfg = load_checkpoint_config(fixture_root).ming
    with torch.device("meta"):
        vit = VisionTransformer(cfg.vision_config)
        projector = VisionProjector(cfg.vision_config, cfg.llm_config.hidden_size)
    init_dummy(vit, seed=3)
    init_dummy(projector, seed=3)
    vc = cfg.vision_config
    m = vc.spatial_merge_size
    width = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
    with torch.no_grad():
        out = projector(vit(torch.randn(4 * m * m, width), torch.tensor([[1, 2 * m, 2 * m]])))
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(4), rtol=0, atol=1e-5)


def test_grid_mismatch_raises(model, case):
    """A grid_thw that does not match the number of patch rows raises ValueError."""
    _, vit, _ = model
    pixels = case[0]["image0_pixel_values"]
    t, h, w = grid_list(case[0]["image0_grid_thw"])[0]
    with pytest.raises(ValueError, match="does not match"):
        vit(pixels, [(t, h, w + vit.merge)])


@torch.no_grad()
def test_bf16_close_to_fp32(fixture_root, model, case):
    """bf16 weights and inputs give image embeddings within 2e-2 relative L2 error of fp32."""
    _, vit16, projector16 = _build(fixture_root, torch.bfloat16)
    tensors = case[0]
    ref = tensors["batched_image_embeds"]
    out = projector16(vit16(tensors["batched_pixel_values"].bfloat16(), tensors["batched_grid_thw"]))
    assert out.dtype == torch.bfloat16
    rel = (out.float() - ref).norm() / ref.norm()
    assert rel < 2e-2
