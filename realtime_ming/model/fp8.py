"""FP8 (e4m3) weights: quantisation with per-output-channel or 128x128 block scales, and the stacked
routed-expert tensors of a thinker MoE layer stored that way.

`quantize(w, layout)` maps a float tensor [..., out, in] to (q float8_e4m3fn, scale fp32) with
w ≈ q · scale: "channel" keeps one scale per output row ([..., out]), "block" one per BLOCK×BLOCK tile
([..., ceil(out/B), ceil(in/B)]). Each scale is amax / 448 (e4m3's largest finite value), so every row
(tile) uses the format's whole range; values round to nearest even. The experts ship per-output-channel
(`EXPERT_LAYOUT`): measured on the fixture weights and on random full-shape weights the two layouts' errors
agree to within 1 % (e4m3's 3 mantissa bits set the error, the scale only its range: docs/fidelity.md), and a
per-row scale is one multiply after the dot product, in every kernel, at any tensor-parallel split.

`Fp8Stack` reads a quantised [E, out, in] stack back as model-dtype weights by expert index: the PyTorch
reference path of `moe.py` (`experts_gathered` / `experts_grouped`) dequantises only the experts it uses.
`stack_loader` / `stack_dummy_init` fill the fp8 parameters (and their scales) from bf16 checkpoint tensors
one expert part at a time, on the parameter's device: no full-precision copy of the experts is ever held.
"""

from __future__ import annotations

from typing import Callable

import torch

from .kernels.moe_fp8 import FP8, FP8_MAX, amax_scale, quantize_rows

__all__ = [
    "EXPERT_DTYPES",
    "EXPERT_LAYOUT",
    "FP8",
    "FP8_MAX",
    "BLOCK",
    "Fp8Stack",
    "quantize",
    "dequantize",
    "quantize_rows",
    "stack_loader",
    "stack_dummy_init",
]

BLOCK = 128  # block layout's tile side (DeepSeek-V3's)
EXPERT_DTYPES = ("model", "fp8")  # engine.expert_dtype: the routed experts in the model dtype, or e4m3
EXPERT_LAYOUT = "channel"  # the experts' scale layout (see the module docstring)


def quantize(w: torch.Tensor, layout: str = EXPERT_LAYOUT, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., out, in] (any float dtype) -> (q [..., out, in] float8_e4m3fn, scale fp32), w ≈ q · scale.

    layout "channel": scale [..., out]; "block": scale [..., ceil(out/block), ceil(in/block)] (edge tiles
    partial). Computed in fp32 on w's device."""
    if w.dim() < 2:
        raise ValueError(f"quantize needs a [..., out, in] tensor, got shape {tuple(w.shape)}")
    if layout == "channel":
        return quantize_rows(w)
    if layout != "block":
        raise ValueError(f"unknown fp8 scale layout {layout!r}; known: channel, block")
    w32 = w.float()
    out, inp = w32.shape[-2:]
    rows, cols = -(-out // block), -(-inp // block)
    padded = torch.nn.functional.pad(w32.abs(), (0, cols * block - inp, 0, rows * block - out))
    amax = padded.view(*w32.shape[:-2], rows, block, cols, block).amax(dim=(-3, -1))
    scale = amax_scale(amax)
    q = (w32 / _expand_blocks(scale, out, inp, block)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def _expand_blocks(scale: torch.Tensor, out: int, inp: int, block: int) -> torch.Tensor:
    """Block scales [..., R, C] -> one per element [..., out, in]."""
    return scale.repeat_interleave(block, -2)[..., :out, :].repeat_interleave(block, -1)[..., :inp]


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32,
               block: int = BLOCK) -> torch.Tensor:
    """(q, scale) of `quantize` -> q · scale in `dtype` (the layout follows from the scale's shape)."""
    if scale.dim() == q.dim() - 1:  # one per output row
        full = scale[..., None]
    else:
        full = _expand_blocks(scale, q.shape[-2], q.shape[-1], block)
    return (q.float() * full).to(dtype)


class Fp8Stack:
    """A quantised expert stack [E, out, in] (per-output-channel scales [E, out]) read by index as `dtype`
    weights: `stack[ids]` dequantises only the experts named (the reference expert paths index this way)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        self.q, self.scale, self.dtype = q, scale, dtype

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def __getitem__(self, index) -> torch.Tensor:
        return dequantize(self.q[index], self.scale[index], self.dtype)


def stack_loader(scale_of: Callable[[], torch.Tensor], narrow: Callable) -> Callable:
    """weight_loader of an fp8 expert stack: `narrow(param, src, shard_id) -> (value, index)` gives this rank's
    part of one checkpoint tensor and where it goes (param[index]); that part is copied to the parameter's
    device, quantised per output row there and written with its scales (scale_of()[index]). A row's scale
    depends on that row alone, so loading part by part equals quantising the loaded stack."""

    def load(param: torch.Tensor, src, shard_id) -> None:
        value, index = narrow(param, src, shard_id)
        q, scale = quantize(value.to(param.device, non_blocking=True), "channel")
        with torch.no_grad():
            param[index].copy_(q)
            scale_of()[index].copy_(scale)

    return load


def stack_dummy_init(scale_of: Callable[[], torch.Tensor], dtype_of: Callable[[], torch.dtype]) -> Callable:
    """dummy_init of an fp8 expert stack: the values `loader.init_dummy` gives the same stack in the model dtype
    (N(0, 1/in) from the same generator), quantised one expert at a time (fp8 dummy = quantised bf16 dummy)."""

    def init(param: torch.Tensor, gen: torch.Generator) -> None:
        full = torch.empty(param.shape, device=param.device, dtype=dtype_of())
        full.normal_(0.0, param.shape[-1] ** -0.5, generator=gen)
        scale = scale_of()
        with torch.no_grad():
            for e in range(param.shape[0]):
                param[e], scale[e] = quantize(full[e], "channel")
        del full

    return init
