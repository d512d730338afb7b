"""The thinker's attention over its slot KV cache (Triton), read in place: decode and prefill.

* `decode_attention`: each row's query against indices 0..position of its own KV slot, read in
  place (no gather, no mask, no KV-length bucket), split over the sequence (flash-decoding) and
  combined;
* `prefill_attention`: a prompt chunk's queries against their own slot, read in place up to each
  query's position (flash attention; no slot gather, no mask, no grouped-K/V expansion).

The references (`*_reference`) gather the slots and run SDPA with a length mask;
tests/test_thinker_kernels.py checks each kernel against them (CUDA, or Triton's CPU interpreter).
"""

from __future__ import annotations

import math

import torch

from . import pdl
from .sdpa import attention_any_length
from .selection import Kernels, interpreting
from .triton_import import tl, triton

__all__ = ["decode_attention", "decode_attention_reference", "prefill_attention", "prefill_attention_reference",
           "prefill_attention_supported"]

_SPLITS = 16  # sequence splits of decode attention (programs = rows x kv heads x splits)


if triton is not None:
    from .pdl import begin

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
                           BLOCK_N: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
        """Partial attention of the G query heads of kv head `kvh` over one split of the row's keys.

        UPCAST: dot in fp32 (Triton's CPU interpreter mis-multiplies bf16 operands). PDL (pdl.py): waits first."""
        begin(PDL)
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
                             G: tl.constexpr, GP: tl.constexpr, HD: tl.constexpr, SPLITS: tl.constexpr,
                             PDL: tl.constexpr):
        """out[b, h] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the splits of one head. PDL: waits
        first."""
        begin(PDL)
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
                     lengths: torch.Tensor, *, kernels: Kernels) -> torch.Tensor:
    """One query per row against its slot's first `lengths[b]` cache entries (all of them visible).

    q [B, H, 1, hd]; k/v_cache [slots, KV, S, hd]; slots, lengths [B] int (lengths >= 1, on the device:
    the kernel reads them, so one CUDA graph serves every length). Returns [B, H, 1, hd] in q's dtype.
    """
    b, h, t, hd = q.shape
    kv = k_cache.shape[1]
    g = h // kv
    if not kernels.applies(q) or t != 1 or h % kv or hd & (hd - 1) or k_cache.stride(-1) != 1:
        return decode_attention_reference(q, k_cache, v_cache, slots, lengths)
    gp = max(16, triton.next_power_of_2(g))
    launch = pdl.launch(q)
    acc = torch.empty(b * kv * _SPLITS * gp, hd, device=q.device, dtype=torch.float32)
    ml = torch.empty(b * kv * _SPLITS * gp, 2, device=q.device, dtype=torch.float32)
    _attn_split_kernel[(b, kv, _SPLITS)](q, k_cache, v_cache, slots, lengths, acc, ml, 1.0 / math.sqrt(hd),
                                         q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
                                         k_cache.stride(2), G=g, GP=gp, HD=hd, SPLITS=_SPLITS, BLOCK_N=32,
                                         PREC="ieee" if q.dtype == torch.float32 else "tf32",
                                         UPCAST=interpreting(), num_warps=4, **launch)
    out = torch.empty(b, h, 1, hd, device=q.device, dtype=q.dtype)
    _attn_combine_kernel[(b, h)](acc, ml, out, out.stride(0), out.stride(1), G=g, GP=gp, HD=hd, SPLITS=_SPLITS,
                                 num_warps=1, **launch)
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
    return attention_any_length(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


def prefill_attention_supported(heads: int, kv_heads: int, head_dim: int) -> bool:
    """Shapes the prefill kernel serves (else `prefill_attention` takes the reference path)."""
    return triton is not None and heads % kv_heads == 0 and head_dim >= 16 and not head_dim & (head_dim - 1)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                      lengths: torch.Tensor, *, kernels: Kernels) -> torch.Tensor:
    """A prompt chunk's queries against their own slot's cache, read in place (flash attention).

    q [B, H, T, hd]; k/v_cache [slots, KV, S, hd] already holding the chunk's keys; slots [B];
    lengths [B, T] int on the device: query t sees indices 0..lengths[b, t]-1 (its position + 1; >= 1).
    No gather of the slots, no mask, no [B, H, S] expansion of grouped K/V: the work is the prompt's
    keys, not the cache capacity, and one CUDA graph serves every prompt length. Returns [B, H, T, hd].
    """
    b, h, t, hd = q.shape
    kv = k_cache.shape[1]
    if (not kernels.applies(q) or not prefill_attention_supported(h, kv, hd)
            or k_cache.stride(-1) != 1 or q.stride(-1) != 1):
        return prefill_attention_reference(q, k_cache, v_cache, slots, lengths)
    out = torch.empty(b, h, t, hd, device=q.device, dtype=q.dtype)
    block_m = 64 if t > 32 else 16
    _prefill_attn_kernel[(b, h, triton.cdiv(t, block_m))](
        q, k_cache, v_cache, out, slots, lengths, 1.0 / math.sqrt(hd), t,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), out.stride(2), lengths.stride(0),
        G=h // kv, HD=hd, BLOCK_M=block_m, BLOCK_N=64, PREC="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST=interpreting(), num_warps=4, num_stages=2)
    return out
