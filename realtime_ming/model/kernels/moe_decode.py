"""The thinker's MoE for decode batches (Triton): the router and the routed + shared experts.

A reference thinker decode layer is ~160 kernels (norms, rotary, cache gathers, a mask, ~20 router
ops, ~15 ops sorting (token, expert) pairs, the shared expert's five); at one token per row the
launches, not the ~0.3 GB of weights a layer reads, set the step time. With `norm.add_rms_norm`,
`rotary.head_rotary`, `slot_attention.decode_attention` and two cuBLAS GEMMs these make the whole
layer eleven launches:

* `route`: fp32 router logits (bf16 weights upcast on load, as the reference's fp32 linear) and the
  group-limited sigmoid top-k with bias, renormalisation and scaling (`moe.select_experts`);
* `moe_decode`: every (token, expert) pair and the shared expert as one GEMV launch for gate|up with
  SwiGLU, one for down with the routing weights, the fp32 sum over experts and the shared expert
  added in the model dtype (`SparseMoeBlock.forward`'s rounding).

They serve batches of up to `MAX_DECODE_TOKENS` tokens and return None otherwise (the caller runs
the reference, or `moe_experts.fused_experts` for prefill). The references are moe.py's PyTorch
paths; tests/test_thinker_kernels.py checks each kernel against them.
"""

from __future__ import annotations

import torch

from . import pdl
from .selection import Kernels
from .step_plan import step_plan
from .triton_import import tl, triton

__all__ = ["MAX_DECODE_TOKENS", "decode_fits", "moe_decode", "moe_tiles", "route", "select"]

MAX_DECODE_TOKENS = 16  # tokens per call these kernels are made for (the largest decode bucket)


if triton is not None:
    from .pdl import begin, release, wait

    @triton.jit(do_not_specialize=['N'])
    def _router_logits_kernel(x_ptr, w_ptr, part_ptr, N, D, E, stride_x, stride_w,
                              SPLITS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        """Split-K partial router logits: part[split, token, e] = fp32(x[token, chunk]) . fp32(W[e, chunk]). PDL
        (pdl.py): the weights' first K chunk is read before waiting for the kernel before."""
        release(PDL)
        tok = tl.program_id(0).to(tl.int64)
        e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
        split = tl.program_id(2)
        ok = e < E
        chunk = tl.cdiv(D, SPLITS)
        k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_E, BLOCK_K), tl.float32)
        if PDL:  # the loop's first step, the same sum order
            kk = split * chunk + k
            kok = kk < tl.minimum(D, (split + 1) * chunk)
            w = tl.load(w_ptr + e[:, None].to(tl.int64) * stride_w + kk[None, :], mask=ok[:, None] & kok[None, :],
                        other=0.0).to(tl.float32)
            wait(PDL)
            acc += w * tl.load(x_ptr + tok * stride_x + kk, mask=kok, other=0.0).to(tl.float32)[None, :]
        for k0 in range(split * chunk + BLOCK_K * PDL, tl.minimum(D, (split + 1) * chunk), BLOCK_K):
            kk = k0 + k
            kok = kk < tl.minimum(D, (split + 1) * chunk)
            x = tl.load(x_ptr + tok * stride_x + kk, mask=kok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + e[:, None].to(tl.int64) * stride_w + kk[None, :], mask=ok[:, None] & kok[None, :],
                        other=0.0).to(tl.float32)
            acc += w * x[None, :]
        tl.store(part_ptr + (split * N + tok) * E + e, tl.sum(acc, axis=1), mask=ok)

    @triton.jit(do_not_specialize=['N'])
    def _router_select_kernel(part_ptr, bias_ptr, ids_ptr, weights_ptr, N, scale, bias_stride,
                              E: tl.constexpr, GROUPS: tl.constexpr, TOPK_GROUP: tl.constexpr, TOPK: tl.constexpr,
                              KP: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr):
        """`moe.select_experts` for one token (after summing the split-K logits): sigmoid, +bias, top-2-sum
        group scores, the top groups, then top-k among their experts (first index on ties). The token's bias
        row starts at bias_ptr + tok * bias_stride (0: one bias for all). PDL (pdl.py): waits first."""
        begin(PDL)
        tok = tl.program_id(0).to(tl.int64)
        per: tl.constexpr = E // GROUPS
        grp = tl.arange(0, GROUPS)
        col = tl.arange(0, per)
        idx = grp[:, None] * per + col[None, :]  # [G, per] expert index
        logits = tl.zeros((GROUPS, per), tl.float32)
        for split in tl.static_range(SPLITS):
            logits += tl.load(part_ptr + (split * N + tok) * E + idx)
        scores = tl.sigmoid(logits)
        biased = scores + tl.load(bias_ptr + tok * bias_stride + idx).to(tl.float32)
        first = tl.max(biased, axis=1)
        arg = tl.min(tl.where(biased == first[:, None], col[None, :], per), axis=1)
        second = tl.max(tl.where(col[None, :] == arg[:, None], float("-inf"), biased), axis=1)
        gscore = first + second
        keep = grp < 0
        for _ in tl.static_range(TOPK_GROUP):
            masked = tl.where(keep, float("-inf"), gscore)
            top = tl.max(masked, axis=0)
            best = tl.min(tl.where(masked == top, grp, GROUPS), axis=0)
            keep = keep | (grp == best)
        cand = tl.where(keep[:, None], biased, float("-inf"))
        kk = tl.arange(0, KP)
        ids = tl.zeros((KP,), tl.int64)
        wts = tl.zeros((KP,), tl.float32)
        for j in tl.static_range(TOPK):
            top = tl.max(tl.max(cand, axis=1), axis=0)
            best = tl.min(tl.min(tl.where(cand == top, idx, E), axis=1), axis=0)
            hit = idx == best
            w = tl.sum(tl.sum(tl.where(hit, scores, 0.0), axis=1), axis=0)
            ids = tl.where(kk == j, best.to(tl.int64), ids)
            wts = tl.where(kk == j, w, wts)
            cand = tl.where(hit, float("-inf"), cand)
        if TOPK > 1:
            wts = wts / (tl.sum(wts, axis=0) + 1e-20)
        tl.store(ids_ptr + tok * TOPK + kk, ids, mask=kk < TOPK)
        tl.store(weights_ptr + tok * TOPK + kk, wts * scale, mask=kk < TOPK)


# the router logits' split-K and experts a program (default 16 x 32: a decode batch of one still spreads over >= 128
# programs) and the selection's warps: `step_plan.STEP_PLAN`


def _groups_apply(e: int, n_group: int) -> bool:
    """Whether the selection kernel takes E experts in n_group groups (powers of two, >= 2 experts a group)."""
    per = e // n_group if n_group else 0
    return bool(per) and not e % n_group and not per & (per - 1) and not n_group & (n_group - 1) and per >= 2


def route(x: torch.Tensor, weight: torch.Tensor, expert_bias: torch.Tensor, top_k: int, n_group: int,
          topk_group: int, scale: float, *, kernels: Kernels) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Router of up to MAX_DECODE_TOKENS tokens x [N, D] -> (ids [N, k] int64, weights [N, k] fp32), or
    None when the kernels do not apply (the caller runs `MoEGate`'s reference)."""
    n, d = x.shape
    e = weight.shape[0]
    if (not kernels.applies(x) or n > MAX_DECODE_TOKENS or not _groups_apply(e, n_group) or x.stride(-1) != 1
            or weight.stride(-1) != 1):
        return None
    plan = step_plan()
    splits, block_e = plan.router_splits, plan.router_block_e
    part = torch.empty(splits, n, e, device=x.device, dtype=torch.float32)
    launch = pdl.launch(x)
    _router_logits_kernel[(n, triton.cdiv(e, block_e), splits)](
        x, weight, part, n, d, e, x.stride(0), weight.stride(0), SPLITS=splits, BLOCK_E=block_e,
        BLOCK_K=min(256, triton.next_power_of_2(triton.cdiv(d, splits))), num_warps=4, **launch)
    ids = torch.empty(n, top_k, device=x.device, dtype=torch.int64)
    weights = torch.empty(n, top_k, device=x.device, dtype=torch.float32)
    _router_select_kernel[(n,)](part, expert_bias, ids, weights, n, scale, 0, E=e, GROUPS=n_group,
                                TOPK_GROUP=topk_group, TOPK=top_k, KP=triton.next_power_of_2(top_k), SPLITS=splits,
                                num_warps=plan.select_warps, **launch)
    return ids, weights


def select(logits: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int, scale: float, *,
           kernels: Kernels) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`moe.select_experts` in one launch for any number of tokens (a prefill chunk, a mixed step, a decode batch
    above MAX_DECODE_TOKENS; the reference is ~15 launches with three top-k sorts): logits [N, E] fp32, bias [E]
    or [N, E] (each token's router's) -> (ids [N, k] int64, weights [N, k] fp32), or None when the kernel does
    not apply (the caller runs the reference)."""
    n, e = logits.shape
    if (not kernels.applies(logits) or not n or not _groups_apply(e, n_group) or bias.shape not in ((e,), (n, e))
            or not 1 <= top_k <= topk_group * (e // n_group) or not 1 <= topk_group <= n_group):
        return None
    logits, bias = logits.float().contiguous(), bias.contiguous()
    ids = torch.empty(n, top_k, device=logits.device, dtype=torch.int64)
    weights = torch.empty(n, top_k, device=logits.device, dtype=torch.float32)
    _router_select_kernel[(n,)](logits, bias, ids, weights, n, scale, e if bias.dim() == 2 else 0, E=e,
                                GROUPS=n_group, TOPK_GROUP=topk_group, TOPK=top_k,
                                KP=triton.next_power_of_2(top_k), SPLITS=1, num_warps=4, PDL=False)
    return ids, weights


# ---- experts -----------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _moe_gate_up_kernel(x_ptr, ids_ptr, w_ptr, sg_ptr, su_ptr, act_ptr, live_ptr, D, I, stride_x, stride_we,
                            stride_wn, stride_s, TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            HAS_LIVE: tl.constexpr):
        """act[pair, n] = round(silu(round(x.g_n))) * round(x.u_n) for pair = (token, slot); slot TOPK = shared.
        A token with live[token] == 0 (padding) is skipped: nothing read, its act rows left unwritten."""
        pair = tl.program_id(0).to(tl.int64)
        tok = pair // (TOPK + 1)
        slot = pair % (TOPK + 1)
        if HAS_LIVE:
            if tl.load(live_ptr + tok) == 0:
                return
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nok = n < I
        shared = slot == TOPK
        e = tl.load(ids_ptr + tok * TOPK + tl.minimum(slot, TOPK - 1)).to(tl.int64)
        g_base = tl.where(shared, sg_ptr + n[:, None].to(tl.int64) * stride_s,
                          w_ptr + e * stride_we + n[:, None].to(tl.int64) * stride_wn)
        u_base = tl.where(shared, su_ptr + n[:, None].to(tl.int64) * stride_s,
                          w_ptr + e * stride_we + (I + n[:, None]).to(tl.int64) * stride_wn)
        k = tl.arange(0, BLOCK_K)
        acc_g = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        acc_u = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        for k0 in range(0, D, BLOCK_K):
            kk = k0 + k
            kok = kk < D
            x = tl.load(x_ptr + tok * stride_x + kk, mask=kok, other=0.0).to(tl.float32)[None, :]
            wm = nok[:, None] & kok[None, :]
            acc_g += tl.load(g_base + kk[None, :], mask=wm, other=0.0).to(tl.float32) * x
            acc_u += tl.load(u_base + kk[None, :], mask=wm, other=0.0).to(tl.float32) * x
        ty = act_ptr.dtype.element_ty
        g = tl.sum(acc_g, axis=1).to(ty).to(tl.float32)
        u = tl.sum(acc_u, axis=1).to(ty).to(tl.float32)
        a = (g * tl.sigmoid(g)).to(ty).to(tl.float32) * u
        tl.store(act_ptr + pair * I + n, a.to(ty), mask=nok)

    @triton.jit
    def _moe_down_kernel(act_ptr, ids_ptr, wts_ptr, w_ptr, sd_ptr, out_ptr, live_ptr, D, I, stride_we, stride_wn,
                         stride_s, stride_o, TOPK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                         HAS_LIVE: tl.constexpr):
        """out[token, n] = round(round(sum_k w_k round(act_k . Wd_e[n])) + round(act_s . Wd_shared[n])); 0 for a
        token with live[token] == 0 (nothing read)."""
        tok = tl.program_id(0).to(tl.int64)
        n = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        nok = n < D
        reads = I  # the act columns read: none for a padding token (its output: 0)
        if HAS_LIVE:
            reads = tl.where(tl.load(live_ptr + tok) != 0, I, 0)
        ty = out_ptr.dtype.element_ty
        k = tl.arange(0, BLOCK_K)
        routed = tl.zeros((BLOCK_D,), tl.float32)
        shared = tl.zeros((BLOCK_D,), tl.float32)
        for slot in tl.static_range(TOPK + 1):
            if slot < TOPK:
                e = tl.load(ids_ptr + tok * TOPK + slot).to(tl.int64)
                base = w_ptr + e * stride_we + n[:, None].to(tl.int64) * stride_wn
            else:
                base = sd_ptr + n[:, None].to(tl.int64) * stride_s
            acc = tl.zeros((BLOCK_D, BLOCK_K), tl.float32)
            a_row = act_ptr + (tok * (TOPK + 1) + slot) * I
            for k0 in range(0, reads, BLOCK_K):
                kk = k0 + k
                kok = kk < I
                a = tl.load(a_row + kk, mask=kok, other=0.0).to(tl.float32)
                acc += tl.load(base + kk[None, :], mask=nok[:, None] & kok[None, :], other=0.0).to(tl.float32) * a[None, :]
            y = tl.sum(acc, axis=1).to(ty).to(tl.float32)
            if slot < TOPK:
                routed += y * tl.load(wts_ptr + tok * TOPK + slot)
            else:
                shared = y
        out = routed.to(ty).to(tl.float32) + shared
        tl.store(out_ptr + tok * stride_o + n, out.to(ty), mask=nok)


def moe_tiles(n: int, k: int, inter: int, d: int) -> dict:
    """Tile sizes of the two expert kernels for n tokens (`bench/kernel_bench.py --tune` on an H200 at the real
    shapes, TP=2 rank, us per layer default -> tuned: B=1 46.6 -> 37.0, B=2 66.0 -> 59.3, B=4 127.9 -> 104.9,
    B=8 210.4 -> 178.6, B=16 380.9 -> 316.8; narrow tiles and few warps: many small programs keep more
    loads in flight than a few wide ones)."""
    if n <= 1:
        return {"gu_n": 4, "gu_k": 512, "gu_warps": 2, "dn_d": 4, "dn_k": 512, "dn_warps": 2}
    if n <= 2:
        return {"gu_n": 4, "gu_k": 256, "gu_warps": 4, "dn_d": 2, "dn_k": 512, "dn_warps": 1}
    if n <= 4:
        return {"gu_n": 2, "gu_k": 256, "gu_warps": 2, "dn_d": 2, "dn_k": 512, "dn_warps": 1}
    if n <= 8:
        return {"gu_n": 2, "gu_k": 256, "gu_warps": 1, "dn_d": 2, "dn_k": 512, "dn_warps": 1}
    return {"gu_n": 2, "gu_k": 256, "gu_warps": 1, "dn_d": 2, "dn_k": 256, "dn_warps": 1}


def decode_fits(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, shared_gate: torch.Tensor,
                shared_up: torch.Tensor, shared_down: torch.Tensor, kernels: Kernels) -> bool:
    """True when the decode expert kernels serve these tensors: the selection applies, at most MAX_DECODE_TOKENS
    tokens, a shared expert of the routed experts' width, rows contiguous, gate and up rows equally strided."""
    n, d = x.shape
    inter = w_down.shape[2]
    return (kernels.applies(x) and n <= MAX_DECODE_TOKENS and shared_gate.shape == (inter, d)
            and shared_up.shape == (inter, d) and shared_down.shape == (d, inter)
            and all(t.stride(-1) == 1 for t in (x, w_gate_up, w_down, shared_gate, shared_up, shared_down))
            and shared_gate.stride(0) == shared_up.stride(0))


def moe_decode(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
               w_down: torch.Tensor, shared_gate: torch.Tensor, shared_up: torch.Tensor, shared_down: torch.Tensor,
               *, kernels: Kernels, tune: dict | None = None, live: torch.Tensor | None = None) -> torch.Tensor | None:
    """Routed experts + shared expert of up to MAX_DECODE_TOKENS tokens: x [N, D] -> [N, D] in x's dtype
    (this rank's partial sum under TP), or None when the kernels do not apply. live [N] bool (None: all):
    a token marked False (a padding row) reads no weights and gets 0.

    ids/weights [N, k]; w_gate_up [E, 2I, D], w_down [E, D, I]; shared_gate/up [I, D], shared_down [D, I]
    (the shared expert must have the routed experts' width I).
    """
    n, d = x.shape
    k = ids.shape[1]
    inter = w_down.shape[2]
    if not decode_fits(x, w_gate_up, w_down, shared_gate, shared_up, shared_down, kernels):
        return None
    pairs = n * (k + 1)
    t = {**moe_tiles(n, k, inter, d), **(tune or {})}  # tune: benchmarks
    act = torch.empty(pairs, inter, device=x.device, dtype=x.dtype)
    has_live = live is not None
    live = live.contiguous() if has_live else x  # an unread pointer when every token is live
    _moe_gate_up_kernel[(pairs, triton.cdiv(inter, t["gu_n"]))](
        x, ids.contiguous(), w_gate_up, shared_gate, shared_up, act, live, d, inter, x.stride(0), w_gate_up.stride(0),
        w_gate_up.stride(1), shared_gate.stride(0), TOPK=k, BLOCK_N=t["gu_n"], BLOCK_K=t["gu_k"], HAS_LIVE=has_live,
        num_warps=t["gu_warps"])
    out = torch.empty(n, d, device=x.device, dtype=x.dtype)
    _moe_down_kernel[(n, triton.cdiv(d, t["dn_d"]))](
        act, ids.contiguous(), weights.float().contiguous(), w_down, shared_down, out, live, d, inter,
        w_down.stride(0), w_down.stride(1), shared_down.stride(0), out.stride(0), TOPK=k, BLOCK_D=t["dn_d"],
        BLOCK_K=min(t["dn_k"], triton.next_power_of_2(inter)), HAS_LIVE=has_live, num_warps=t["dn_warps"])
    return out
