"""Thinker feed-forward blocks: dense SwiGLU MLP and the BailingMoeV2 sparse MoE with MultiRouter.

Reproduces `BailingMoeV2MLP`, `BailingMoeV2Gate` and `BailingMoeV2SparseMoeBlock` (docs/model.md §1.4):
fp32 sigmoid router, `expert_bias` for selection only, group-limited top-k, renormalised weights
× routed_scaling_factor, expert outputs weighted and summed in fp32, shared expert added. Experts are
stacked tensors ([E, 2·I, D] gate|up and [E, D, I] down, I sharded under TP) filled from the
per-expert checkpoint keys through `weight_loader`s; routed and shared partial sums share one all-reduce.
With `expert_dtype="fp8"` the routed experts are stored in e4m3 with per-output-channel scales, quantised
while they load (fp8.py); the router, the shared expert and everything else stay in the model dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from . import fp8
from .config import ThinkerConfig
from .kernels import moe_decode as decode_kernels
from .kernels import moe_fp8
from .kernels.dense_gemv import linear
from .kernels.moe_experts import fused_experts
from .kernels.selection import REFERENCE, Kernels
from .kernels.swiglu import silu_mul
from .layers import SINGLE, ColumnParallelLinear, RowParallelLinear, TPGroup, concat_params, mark_tp
from .loader import TensorSource, narrow_for_rank

__all__ = [
    "DenseMLP",
    "MoEGate",
    "SparseMoeBlock",
    "Routing",
    "select_experts",
    "experts_gathered",
    "experts_grouped",
    "GATHER_MAX_ROWS",
]

# (token, expert) pairs up to which the experts' weights are gathered per token (no host sync,
# static shapes: the decode path). Above it, tokens are sorted by expert and each expert that
# received tokens runs once (prefill). The GPU path replaces both with fused kernels (`Kernels`).
GATHER_MAX_ROWS = 16


class Routing(NamedTuple):
    """Experts chosen for every token of one MoE layer: ids [B, T, k] int64, weights [B, T, k] fp32."""

    layer: int
    expert_ids: torch.Tensor
    weights: torch.Tensor


class DenseMLP(nn.Module):
    """SwiGLU `down(silu(gate(x)) * up(x))`; `reduce=False` leaves the TP partial sum to the caller."""

    def __init__(self, hidden: int, intermediate: int, tp: TPGroup = SINGLE, reduce: bool = True, *,
                 kernels: Kernels = REFERENCE):
        super().__init__()
        self.kernels = kernels
        self.gate_proj = ColumnParallelLinear(hidden, intermediate, tp=tp, kernels=kernels)
        self.up_proj = ColumnParallelLinear(hidden, intermediate, tp=tp, kernels=kernels)
        self.down_proj = RowParallelLinear(intermediate, hidden, tp=tp, reduce=reduce, kernels=kernels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = linear(x, concat_params(self, "_gate_up", (self.gate_proj.weight, self.up_proj.weight)),
                         kernels=self.kernels)
        return self.down_proj(silu_mul(gate_up, kernels=self.kernels))


def select_experts(
    logits: torch.Tensor, expert_bias: torch.Tensor, top_k: int, n_group: int, topk_group: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-limited sigmoid routing: logits [N, E] fp32 -> (ids [N, k] int64, weights [N, k] fp32).

    Selection uses sigmoid + bias; group score = sum of the group's top-2; the top `topk_group`
    groups stay eligible; weights are the unbiased sigmoid scores renormalised × `scale`.
    """
    n, e = logits.shape
    scores = torch.sigmoid(logits)
    biased = scores + expert_bias.float()
    group_scores = biased.view(n, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)  # [N, G]
    groups = group_scores.topk(topk_group, dim=-1, sorted=False).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    keep = keep.unsqueeze(-1).expand(n, n_group, e // n_group).reshape(n, e)
    ids = biased.masked_fill(~keep, float("-inf")).topk(top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if top_k > 1:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return ids, weights * scale


def _swiglu(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def experts_gathered(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                     w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Per-token gather of the chosen experts' weights: x [N, D] -> [N, D] fp32 (sync-free)."""
    h = (w_gate_up[ids] @ x[:, None, :, None]).squeeze(-1)  # [N, k, 2I]
    y = (w_down[ids] @ _swiglu(h)[..., None]).squeeze(-1)  # [N, k, D] model dtype
    return (y.float() * weights[..., None]).sum(1)


def experts_grouped(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                    w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Sort (token, expert) pairs by expert and run each used expert once: x [N, D] -> [N, D] fp32.

    Reads the per-expert counts on the host (prefill only).
    """
    n, k = ids.shape
    flat = ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=w_gate_up.shape[0]).tolist()
    rows = x[order // k]  # [N*k, D] grouped by expert
    out = torch.empty_like(rows)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        seg = rows[start:start + count]
        out[start:start + count] = _swiglu(seg @ w_gate_up[expert].t()) @ w_down[expert].t()
        start += count
    y = torch.empty_like(out)
    y[order] = out
    return (y.view(n, k, -1).float() * weights[..., None]).sum(1)


class MoEGate(nn.Module):
    """One router (`gate`, `image_gate` or `audio_gate`): weight [E, D], selection bias [E]."""

    def __init__(self, cfg: ThinkerConfig):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        # a Parameter (not a buffer) like the reference, so dummy init fills it N(0, 0.05²)
        self.expert_bias = nn.Parameter(torch.empty(cfg.num_experts), requires_grad=False)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, D] -> router logits [N, E] in fp32 whatever the dtype."""
        return F.linear(x.float(), self.weight.float())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, D] -> (ids [N, k] int64, weights [N, k] fp32)."""
        c = self.cfg
        return select_experts(self.logits(x), self.expert_bias, c.num_experts_per_tok, c.n_group, c.topk_group,
                              c.routed_scaling_factor)


def _stacked_narrow(tp: TPGroup, intermediate: int):
    """(param, src, shard_id) -> (this rank's part of the checkpoint tensor, its index in param): gate_proj /
    up_proj [I, D] (shard (e, 0|1)) -> rows of param[e] of `experts_gate_up`, down_proj [D, I] (shard e) ->
    param[e] of `experts_down`."""
    local = tp.divide(intermediate, "moe_intermediate_size")

    def narrow(param: torch.Tensor, src: TensorSource, shard_id):
        if isinstance(shard_id, tuple):  # gate_proj / up_proj [I, D] -> rows of param[e]
            expert, part = shard_id
            value = narrow_for_rank(src, 0, None, tp)
            target_shape = (local, param.shape[2])
            index = (expert, slice(part * local, (part + 1) * local))
        else:  # down_proj [D, I] -> param[e]
            expert = shard_id
            value = narrow_for_rank(src, 1, None, tp)
            target_shape = tuple(param.shape[1:])
            index = expert
        if not 0 <= expert < param.shape[0]:
            raise ValueError(f"expert index {expert} outside 0..{param.shape[0] - 1}")
        if tuple(value.shape) != target_shape:
            raise ValueError(f"checkpoint {tuple(src.shape)} -> rank part {tuple(value.shape)}, expected {target_shape}")
        return value, index

    return narrow


def _stacked_loader(narrow):
    """weight_loader of a stacked expert parameter in the model dtype."""

    def load(param: torch.Tensor, src: TensorSource, shard_id) -> None:
        value, index = narrow(param, src, shard_id)
        with torch.no_grad():
            param[index].copy_(value)

    return load


class SparseMoeBlock(nn.Module):
    """Routed experts (stacked) + shared expert; MultiRouter picks a gate per token from the masks.

    `kernels`: the Triton router and decode experts (`triton`) and prefill experts (`moe_experts`)."""

    def __init__(self, cfg: ThinkerConfig, tp: TPGroup = SINGLE, *, kernels: Kernels = REFERENCE,
                 expert_dtype: str = "model"):
        super().__init__()
        if expert_dtype not in fp8.EXPERT_DTYPES:
            raise ValueError(f"expert_dtype must be one of {fp8.EXPERT_DTYPES}, got {expert_dtype!r}")
        self.cfg, self.tp, self.kernels = cfg, tp, kernels
        self.fp8 = expert_dtype == "fp8"
        e, d = cfg.num_experts, cfg.hidden_size
        local = tp.divide(cfg.moe_intermediate_size, "moe_intermediate_size")
        self.gate = MoEGate(cfg)
        if cfg.is_multi_router:
            self.image_gate = MoEGate(cfg)
            self.audio_gate = MoEGate(cfg)
        narrow = _stacked_narrow(tp, cfg.moe_intermediate_size)
        stored = fp8.FP8 if self.fp8 else None  # None: the model dtype (materialize's)
        grad = not self.fp8  # an fp8 tensor has no gradient
        self.experts_gate_up = nn.Parameter(torch.empty(e, 2 * local, d, dtype=stored), requires_grad=grad)
        self.experts_down = nn.Parameter(torch.empty(e, d, local, dtype=stored), requires_grad=grad)  # [E, D, I_local]
        if self.fp8:  # per-output-channel scales, filled with the weights (not checkpoint keys)
            self.register_buffer("experts_gate_up_scale", torch.empty(e, 2 * local, dtype=torch.float32), persistent=False)
            self.register_buffer("experts_down_scale", torch.empty(e, d, dtype=torch.float32), persistent=False)
            self.keep_dtypes = {"experts_gate_up": fp8.FP8, "experts_down": fp8.FP8,
                                "experts_gate_up_scale": torch.float32, "experts_down_scale": torch.float32}
        for name, shards in (("experts_gate_up", 2 * e), ("experts_down", e)):
            p = getattr(self, name)
            mark_tp(p, None)
            p.num_shards, p.stacked = shards, True
            if self.fp8:
                scale_of = (lambda n=name + "_scale": getattr(self, n))
                p.weight_loader = fp8.stack_loader(scale_of, narrow)
                p.dummy_init = fp8.stack_dummy_init(scale_of, lambda: self.gate.weight.dtype)
            else:
                p.weight_loader = _stacked_loader(narrow)
        self.shared_experts = DenseMLP(d, cfg.moe_intermediate_size * cfg.num_shared_experts, tp, reduce=False,
                                       kernels=kernels)

    def route(self, x: torch.Tensor, image_mask: torch.Tensor | None = None,
              audio_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, D]; masks [N] bool or None -> (ids [N, k], weights [N, k] fp32) per token's gate.

        With modality masks the routers in use share one fp32 GEMM (their weights concatenated, cached),
        then each token's own router's logits and bias go through one selection (a token in both masks
        takes the audio router, as the reference's order of overrides does)."""
        used = [(g, m) for g, m in (("image_gate", image_mask), ("audio_gate", audio_mask))
                if m is not None and self.cfg.is_multi_router]
        if not used:  # `self.gate(x)`, the selection in one launch where the kernels apply
            return self._select(self.gate.logits(x), self.gate.expert_bias)
        gates = [self.gate] + [getattr(self, g) for g, _ in used]
        n, e = x.shape[0], self.cfg.num_experts
        name = "_routers_gate_" + "_".join(g for g, _ in used)
        weight = concat_params(self, name, tuple(g.weight for g in gates), torch.float32)
        logits = F.linear(x.float(), weight).view(n, len(gates), e)
        which = torch.zeros(n, dtype=torch.int64, device=x.device)  # 0 = text gate; later masks override
        for j, (_, mask) in enumerate(used, 1):
            which = torch.where(mask, j, which)
        logits = logits.gather(1, which[:, None, None].expand(n, 1, e)).squeeze(1)
        bias = torch.stack([g.expert_bias for g in gates])[which]  # [N, E]
        return self._select(logits, bias)

    def _select(self, logits: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`select_experts`, as one kernel launch where the kernels apply (`moe_decode.select`)."""
        c = self.cfg
        args = (c.num_experts_per_tok, c.n_group, c.topk_group, c.routed_scaling_factor)
        return decode_kernels.select(logits, bias, *args, kernels=self.kernels) or select_experts(logits, bias, *args)

    def forward(self, x: torch.Tensor, image_mask: torch.Tensor | None = None,
                audio_mask: torch.Tensor | None = None, routing: list | None = None,
                layer: int = -1, live: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, D]; masks [B, T] bool (prefill only; None = text gate) -> [B, T, D].

        live [B*T] bool (None: all): False marks a padding token (a graph bucket's filler) whose output
        is garbage: its routed experts cost nothing -- the decode kernels skip its pairs (its expert
        output is 0), the other paths route it to the first token's experts (no extra expert read)."""
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        decoded = None
        if image_mask is None and audio_mask is None:  # text tokens: the fused decode kernels may apply
            c = self.cfg
            decoded = decode_kernels.route(flat, self.gate.weight, self.gate.expert_bias, c.num_experts_per_tok,
                                           c.n_group, c.topk_group, c.routed_scaling_factor, kernels=self.kernels)
        if decoded is None:
            ids, weights = self.route(
                flat,
                image_mask.reshape(-1) if image_mask is not None else None,
                audio_mask.reshape(-1) if audio_mask is not None else None,
            )
        else:
            ids, weights = decoded
        if routing is not None:
            routing.append(Routing(layer, ids.view(b, t, -1), weights.view(b, t, -1)))
        shared = self.shared_experts
        out = None
        if decoded is not None:  # routed + shared experts in two launches
            args = (flat, ids, weights, self.experts_gate_up, self.experts_down, shared.gate_proj.weight,
                    shared.up_proj.weight, shared.down_proj.weight)
            if self.fp8:  # the GEMVs where the plan picks them for this row count, else the tensor-core path
                if moe_fp8.decode_plan().path(b * t) == "gemv":
                    out = moe_fp8.moe_decode(*args, self.experts_gate_up_scale, self.experts_down_scale,
                                             kernels=self.kernels, live=live)
            else:
                out = decode_kernels.moe_decode(*args, kernels=self.kernels, live=live)
        if out is None:
            if live is not None:
                ids = torch.where(live[:, None], ids, ids[:1])
            out = self.routed(flat, ids, weights).to(x.dtype) + shared(flat)
        return self.tp.all_reduce(out).view(b, t, d)

    def routed(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The routed experts' weighted sum of any number of tokens: x [N, D] -> [N, D] fp32 (the Triton experts
        on CUDA where selected, else the PyTorch gather / grouped paths, fp8 experts dequantised per use)."""
        w_gate_up, w_down = self.experts_gate_up, self.experts_down
        if self.kernels.experts_apply(x):
            if self.fp8:
                return moe_fp8.fused_experts(x, ids, weights, w_gate_up, w_down, self.experts_gate_up_scale,
                                             self.experts_down_scale, **moe_fp8.decode_plan().grouped_tiles(len(x)))
            return fused_experts(x, ids, weights, w_gate_up, w_down)
        if self.fp8:
            w_gate_up = fp8.Fp8Stack(w_gate_up, self.experts_gate_up_scale, x.dtype)
            w_down = fp8.Fp8Stack(w_down, self.experts_down_scale, x.dtype)
        experts = experts_gathered if ids.numel() <= GATHER_MAX_ROWS else experts_grouped
        return experts(x, ids, weights, w_gate_up, w_down)
