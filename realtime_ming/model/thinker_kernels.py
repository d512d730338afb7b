"""Thinker kernels (Triton): attention over the slot cache (decode and prefill), the MoE router and experts.

A reference thinker decode layer is ~160 kernels (norms, rotary, cache gathers, a mask, ~20 router
ops, ~15 ops sorting (token, expert) pairs, the shared expert's five); at one token per row the
launches, not the ~0.3 GB of weights a layer reads, set the step time. These kernels do the same
math in seven launches per layer (with `fused.add_rms_norm`, `fused.head_rotary` and two cuBLAS
GEMMs the whole layer is eleven):

* `decode_attention`: each row's query against indices 0..position of its own KV slot, read in
  place (no gather, no mask, no KV-length bucket), split over the sequence (flash-decoding) and
  combined;
* `route`: fp32 router logits (bf16 weights upcast on load, as the reference's fp32 linear) and the
  group-limited sigmoid top-k with bias, renormalisation and scaling (`moe.select_experts`);
* `moe_decode`: every (token, expert) pair and the shared expert as one GEMV launch for gate|up with
  SwiGLU, one for down with the routing weights, the fp32 sum over experts and the shared expert
  added in the model dtype (`SparseMoeBlock.forward`'s rounding).

* `prefill_attention`: a prompt chunk's queries against their own slot, read in place up to each
  query's position (flash attention; no slot gather, no mask, no grouped-K/V expansion).

The decode kernels serve batches of up to `MAX_DECODE_TOKENS` tokens; prefill's experts run in
`moe_triton.fused_experts`. The references are `fused`'s/`moe.py`'s PyTorch paths;
tests/test_thinker_kernels.py checks each kernel against them (CUDA, or Triton's CPU interpreter).
"""

from __future__ import annotations

import math

import torch

from . import fused

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU-only machines
    triton = None

__all__ = ["MAX_DECODE_TOKENS", "decode_attention", "prefill_attention", "route", "moe_decode"]

MAX_DECODE_TOKENS = 16  # tokens per call these kernels are made for (the largest decode bucket)
_SPLITS = 16  # sequence splits of decode attention (programs = rows x kv heads x splits)


if triton is not None:

    @triton.jit
    def _attend_keys(q, m, l, acc, k_ptr, v_ptr, base, n, ok, visible, sk_s, d, scale,
                     PREC: tl.constexpr, UPCAST: tl.constexpr):
        """Fold one block of keys n (loaded where `ok` [N], scored where `visible` [M or 1, N]) into the
        online-softmax state (m, l, acc) of the queries q [M, HD]; returns the new state."""
        kt = tl.load(k_ptr + base + n[None, :] * sk_s + d[:, None], mask=ok[None, :], other=0.0)  # [HD, N]
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PREC) * scale
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + base + n[:, None] * sk_s + d[None, :], mask=ok[:, None], other=0.0)  # [N, HD]
        p = p.to(v_ptr.dtype.element_ty)  # P rounded to the cache dtype before P.V, as flash attention does
        if UPCAST:
            v, p = v.to(tl.float32), p.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PREC)
        return m_new, l, acc

    @triton.jit
    def _attn_split_kernel(q_ptr, k_ptr, v_ptr, slots_ptr, len_ptr, acc_ptr, ml_ptr, scale,
                           sq_b, sq_h, sk_r, sk_h, sk_s,
                           G: tl.constexpr, GP: tl.constexpr, HD: tl.constexpr, SPLITS: tl.constexpr,
                           BLOCK_N: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
        """Partial attention of the G query heads of kv head `kvh` over one split of the row's keys.

        UPCAST: dot in fp32 (Triton's CPU interpreter mis-multiplies bf16 operands)."""
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        n_kv = tl.num_programs(1)
        length = tl.load(len_ptr + b)
        slot = tl.load(slots_ptr + b).to(tl.int64)
        chunk = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
        start = split * chunk
        end = tl.minimum(length, start + chunk)
        g = tl.arange(0, GP)
        d = tl.arange(0, HD)
        q = tl.load(q_ptr + b * sq_b + (kvh * G + g)[:, None] * sq_h + d[None, :], mask=(g < G)[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        base = slot * sk_r + kvh * sk_h
        m = tl.full((GP,), float("-inf"), tl.float32)
        l = tl.zeros((GP,), tl.float32)
        acc = tl.zeros((GP, HD), tl.float32)
        offs = tl.arange(0, BLOCK_N)
        for n0 in range(start, end, BLOCK_N):
            n = n0 + offs
            ok = n < end
            m, l, acc = _attend_keys(q, m, l, acc, k_ptr, v_ptr, base, n, ok, ok[None, :], sk_s, d, scale, PREC, UPCAST)
        part = (b * n_kv + kvh) * SPLITS + split
        tl.store(acc_ptr + (part * GP + g)[:, None] * HD + d[None, :], acc)
        tl.store(ml_ptr + (part * GP + g) * 2, m)
        tl.store(ml_ptr + (part * GP + g) * 2 + 1, l)

    @triton.jit
    def _attn_combine_kernel(acc_ptr, ml_ptr, out_ptr, so_b, so_h,
                             G: tl.constexpr, GP: tl.constexpr, HD: tl.constexpr, SPLITS: tl.constexpr):
        """out[b, h] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the splits of one head."""
        b = tl.program_id(0)
        h = tl.program_id(1)
        n_kv = tl.num_programs(1) // G
        kvh = h // G
        g = h % G
        s = tl.arange(0, SPLITS)
        part = (b * n_kv + kvh) * SPLITS + s
        m = tl.load(ml_ptr + (part * GP + g) * 2)
        l = tl.load(ml_ptr + (part * GP + g) * 2 + 1)
        big = tl.max(m, axis=0)
        w = tl.where(m > float("-inf"), tl.exp(m - big), 0.0)
        d = tl.arange(0, HD)
        acc = tl.load(acc_ptr + (part * GP + g)[:, None] * HD + d[None, :])
        out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
        tl.store(out_ptr + b * so_b + h * so_h + d, out.to(out_ptr.dtype.element_ty))


def decode_attention_reference(q, k_cache, v_cache, slots, lengths):
    """SDPA of q [B, H, 1, hd] over k/v_cache[slots[b], :, :lengths[b]] (GQA) -> [B, H, 1, hd]."""
    return prefill_attention_reference(q, k_cache, v_cache, slots, lengths[:, None])


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     lengths: torch.Tensor, *, force: bool = False) -> torch.Tensor:
    """One query per row against its slot's first `lengths[b]` cache entries (all of them visible).

    q [B, H, 1, hd]; k/v_cache [slots, KV, S, hd]; slots, lengths [B] int (lengths >= 1, on the device:
    the kernel reads them, so one CUDA graph serves every length). Returns [B, H, 1, hd] in q's dtype.
    """
    b, h, t, hd = q.shape
    kv = k_cache.shape[1]
    g = h // kv
    if not fused.use_triton(q, force) or t != 1 or h % kv or hd & (hd - 1) or k_cache.stride(-1) != 1:
        return decode_attention_reference(q, k_cache, v_cache, slots, lengths)
    gp = max(16, triton.next_power_of_2(g))
    acc = torch.empty(b * kv * _SPLITS * gp, hd, device=q.device, dtype=torch.float32)
    ml = torch.empty(b * kv * _SPLITS * gp, 2, device=q.device, dtype=torch.float32)
    _attn_split_kernel[(b, kv, _SPLITS)](q, k_cache, v_cache, slots, lengths, acc, ml, 1.0 / math.sqrt(hd),
                                         q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
                                         k_cache.stride(2), G=g, GP=gp, HD=hd, SPLITS=_SPLITS, BLOCK_N=32,
                                         PREC="ieee" if q.dtype == torch.float32 else "tf32",
                                         UPCAST=fused.interpreting(), num_warps=4)
    out = torch.empty(b, h, 1, hd, device=q.device, dtype=q.dtype)
    _attn_combine_kernel[(b, h)](acc, ml, out, out.stride(0), out.stride(1), G=g, GP=gp, HD=hd, SPLITS=_SPLITS,
                                 num_warps=1)
    return out


# ---- prefill attention -------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _prefill_attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, slots_ptr, len_ptr, scale, T,
                             sq_b, sq_h, sq_t, sk_r, sk_h, sk_s, so_b, so_h, so_t, sl_b,
                             G: tl.constexpr, HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             PREC: tl.constexpr, UPCAST: tl.constexpr):
        """BLOCK_M queries of one row and head against their slot's keys 0..lengths-1, read in place.

        The loop ends at the block's longest length: the work follows the prompt, not the cache."""
        b = tl.program_id(0)
        h = tl.program_id(1)
        rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
        live = rows < T
        lens = tl.load(len_ptr + b * sl_b + rows, mask=live, other=1)
        end = tl.max(lens, axis=0)
        slot = tl.load(slots_ptr + b).to(tl.int64)
        d = tl.arange(0, HD)
        q = tl.load(q_ptr + b * sq_b + h * sq_h + rows[:, None] * sq_t + d[None, :], mask=live[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        base = slot * sk_r + (h // G) * sk_h
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, HD), tl.float32)
        offs = tl.arange(0, BLOCK_N)
        for n0 in range(0, end, BLOCK_N):  # key 0 is visible to every query: m is finite after the first block
            n = n0 + offs
            m, l, acc = _attend_keys(q, m, l, acc, k_ptr, v_ptr, base, n, n < end, n[None, :] < lens[:, None], sk_s,
                                     d, scale, PREC, UPCAST)
        out = acc / l[:, None]
        tl.store(o_ptr + b * so_b + h * so_h + rows[:, None] * so_t + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=live[:, None])


def prefill_attention_reference(q, k_cache, v_cache, slots, lengths):
    """SDPA of q [B, H, T, hd] over k/v_cache[slots[b]]: query t sees indices 0..lengths[b, t]-1 (GQA)."""
    cap = k_cache.shape[2]
    k, v = k_cache.index_select(0, slots), v_cache.index_select(0, slots)
    mask = torch.arange(cap, device=q.device)[None, None, None, :] < lengths[:, None, :, None]
    return fused.attention_any_length(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


def prefill_attention_supported(heads: int, kv_heads: int, head_dim: int) -> bool:
    """Shapes the prefill kernel serves (else `prefill_attention` takes the reference path)."""
    return triton is not None and heads % kv_heads == 0 and head_dim >= 16 and not head_dim & (head_dim - 1)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                      lengths: torch.Tensor, *, force: bool = False) -> torch.Tensor:
    """A prompt chunk's queries against their own slot's cache, read in place (flash attention).

    q [B, H, T, hd]; k/v_cache [slots, KV, S, hd] already holding the chunk's keys; slots [B];
    lengths [B, T] int on the device: query t sees indices 0..lengths[b, t]-1 (its position + 1; >= 1).
    No gather of the slots, no mask, no [B, H, S] expansion of grouped K/V: the work is the prompt's
    keys, not the cache capacity, and one CUDA graph serves every prompt length. Returns [B, H, T, hd].
    """
    b, h, t, hd = q.shape
    kv = k_cache.shape[1]
    if (not fused.use_triton(q, force) or not prefill_attention_supported(h, kv, hd)
            or k_cache.stride(-1) != 1 or q.stride(-1) != 1):
        return prefill_attention_reference(q, k_cache, v_cache, slots, lengths)
    out = torch.empty(b, h, t, hd, device=q.device, dtype=q.dtype)
    block_m = 64 if t > 32 else 16
    _prefill_attn_kernel[(b, h, triton.cdiv(t, block_m))](
        q, k_cache, v_cache, out, slots, lengths, 1.0 / math.sqrt(hd), t,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), out.stride(2), lengths.stride(0),
        G=h // kv, HD=hd, BLOCK_M=block_m, BLOCK_N=64, PREC="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST=fused.interpreting(), num_warps=4, num_stages=2)
    return out


# ---- router ------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit(do_not_specialize=['N'])
    def _router_logits_kernel(x_ptr, w_ptr, part_ptr, N, D, E, stride_x, stride_w,
                              SPLITS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
        """Split-K partial router logits: part[split, token, e] = fp32(x[token, chunk]) . fp32(W[e, chunk])."""
        tok = tl.program_id(0).to(tl.int64)
        e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
        split = tl.program_id(2)
        ok = e < E
        chunk = tl.cdiv(D, SPLITS)
        k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_E, BLOCK_K), tl.float32)
        for k0 in range(split * chunk, tl.minimum(D, (split + 1) * chunk), BLOCK_K):
            kk = k0 + k
            kok = kk < tl.minimum(D, (split + 1) * chunk)
            x = tl.load(x_ptr + tok * stride_x + kk, mask=kok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + e[:, None].to(tl.int64) * stride_w + kk[None, :], mask=ok[:, None] & kok[None, :],
                        other=0.0).to(tl.float32)
            acc += w * x[None, :]
        tl.store(part_ptr + (split * N + tok) * E + e, tl.sum(acc, axis=1), mask=ok)

    @triton.jit(do_not_specialize=['N'])
    def _router_select_kernel(part_ptr, bias_ptr, ids_ptr, weights_ptr, N, scale,
                              E: tl.constexpr, GROUPS: tl.constexpr, TOPK_GROUP: tl.constexpr, TOPK: tl.constexpr,
                              KP: tl.constexpr, SPLITS: tl.constexpr):
        """`moe.select_experts` for one token (after summing the split-K logits): sigmoid, +bias, top-2-sum
        group scores, the top groups, then top-k among their experts (first index on ties)."""
        tok = tl.program_id(0).to(tl.int64)
        per: tl.constexpr = E // GROUPS
        grp = tl.arange(0, GROUPS)
        col = tl.arange(0, per)
        idx = grp[:, None] * per + col[None, :]  # [G, per] expert index
        logits = tl.zeros((GROUPS, per), tl.float32)
        for split in tl.static_range(SPLITS):
            logits += tl.load(part_ptr + (split * N + tok) * E + idx)
        scores = tl.sigmoid(logits)
        biased = scores + tl.load(bias_ptr + idx).to(tl.float32)
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


_ROUTER_SPLITS = 16  # split-K of the router logits: a decode batch of one still spreads over >= 128 programs


def route(x: torch.Tensor, weight: torch.Tensor, expert_bias: torch.Tensor, top_k: int, n_group: int,
          topk_group: int, scale: float, *, force: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Router of up to MAX_DECODE_TOKENS tokens x [N, D] -> (ids [N, k] int64, weights [N, k] fp32), or
    None when the kernels do not apply (the caller runs `MoEGate`'s reference)."""
    n, d = x.shape
    e = weight.shape[0]
    per = e // n_group if n_group else 0
    if (not fused.use_triton(x, force) or n > MAX_DECODE_TOKENS or not per or e % n_group or per & (per - 1)
            or n_group & (n_group - 1) or per < 2 or x.stride(-1) != 1 or weight.stride(-1) != 1):
        return None
    splits, block_e = _ROUTER_SPLITS, 32
    part = torch.empty(splits, n, e, device=x.device, dtype=torch.float32)
    _router_logits_kernel[(n, triton.cdiv(e, block_e), splits)](
        x, weight, part, n, d, e, x.stride(0), weight.stride(0), SPLITS=splits, BLOCK_E=block_e,
        BLOCK_K=min(256, triton.next_power_of_2(triton.cdiv(d, splits))), num_warps=4)
    ids = torch.empty(n, top_k, device=x.device, dtype=torch.int64)
    weights = torch.empty(n, top_k, device=x.device, dtype=torch.float32)
    _router_select_kernel[(n,)](part, expert_bias, ids, weights, n, scale, E=e, GROUPS=n_group,
                                TOPK_GROUP=topk_group, TOPK=top_k, KP=triton.next_power_of_2(top_k), SPLITS=splits,
                                num_warps=4)
    return ids, weights


# ---- experts -----------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _moe_gate_up_kernel(x_ptr, ids_ptr, w_ptr, sg_ptr, su_ptr, act_ptr, D, I, stride_x, stride_we, stride_wn,
                            stride_s, TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """act[pair, n] = round(silu(round(x.g_n))) * round(x.u_n) for pair = (token, slot); slot TOPK = shared."""
        pair = tl.program_id(0).to(tl.int64)
        tok = pair // (TOPK + 1)
        slot = pair % (TOPK + 1)
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
    def _moe_down_kernel(act_ptr, ids_ptr, wts_ptr, w_ptr, sd_ptr, out_ptr, D, I, stride_we, stride_wn, stride_s,
                         stride_o, TOPK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr):
        """out[token, n] = round(round(sum_k w_k round(act_k . Wd_e[n])) + round(act_s . Wd_shared[n]))."""
        tok = tl.program_id(0).to(tl.int64)
        n = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        nok = n < D
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
            for k0 in range(0, I, BLOCK_K):
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


def _moe_tiles(n: int, k: int, inter: int, d: int) -> dict:
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


def moe_decode(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
               w_down: torch.Tensor, shared_gate: torch.Tensor, shared_up: torch.Tensor, shared_down: torch.Tensor,
               *, force: bool = False, tune: dict | None = None) -> torch.Tensor | None:
    """Routed experts + shared expert of up to MAX_DECODE_TOKENS tokens: x [N, D] -> [N, D] in x's dtype
    (this rank's partial sum under TP), or None when the kernels do not apply.

    ids/weights [N, k]; w_gate_up [E, 2I, D], w_down [E, D, I]; shared_gate/up [I, D], shared_down [D, I]
    (the shared expert must have the routed experts' width I).
    """
    n, d = x.shape
    k = ids.shape[1]
    inter = w_down.shape[2]
    if (not fused.use_triton(x, force) or n > MAX_DECODE_TOKENS or shared_gate.shape != (inter, d)
            or shared_up.shape != (inter, d) or shared_down.shape != (d, inter)
            or any(t.stride(-1) != 1 for t in (x, w_gate_up, w_down, shared_gate, shared_up, shared_down))
            or shared_gate.stride(0) != shared_up.stride(0)):
        return None
    pairs = n * (k + 1)
    t = {**_moe_tiles(n, k, inter, d), **(tune or {})}  # tune: benchmarks
    act = torch.empty(pairs, inter, device=x.device, dtype=x.dtype)
    _moe_gate_up_kernel[(pairs, triton.cdiv(inter, t["gu_n"]))](
        x, ids.contiguous(), w_gate_up, shared_gate, shared_up, act, d, inter, x.stride(0), w_gate_up.stride(0),
        w_gate_up.stride(1), shared_gate.stride(0), TOPK=k, BLOCK_N=t["gu_n"], BLOCK_K=t["gu_k"],
        num_warps=t["gu_warps"])
    out = torch.empty(n, d, device=x.device, dtype=x.dtype)
    _moe_down_kernel[(n, triton.cdiv(d, t["dn_d"]))](
        act, ids.contiguous(), weights.float().contiguous(), w_down, shared_down, out, d, inter, w_down.stride(0),
        w_down.stride(1), shared_down.stride(0), out.stride(0), TOPK=k, BLOCK_D=t["dn_d"],
        BLOCK_K=min(t["dn_k"], triton.next_power_of_2(inter)), num_warps=t["dn_warps"])
    return out
