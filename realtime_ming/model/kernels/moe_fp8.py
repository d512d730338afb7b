"""The thinker's routed experts stored in FP8 (e4m3, one fp32 scale per output row; model/fp8.py), in Triton.

Same structure and rounding points as the model-dtype kernels:

* `moe_decode` (as `moe_decode.moe_decode`, up to MAX_DECODE_TOKENS tokens): every (token, expert) pair and
  the shared expert in one GEMV launch for gate|up + SwiGLU and one for down + the routing weights. The fp8
  rows are widened to fp32 in registers and the row's scale multiplies the dot product: weight-only, the
  activations stay in the model dtype. The shared expert stays in the model dtype.
* `fused_experts` (as `moe_experts.fused_experts`, any token count): pairs sorted into blocks of one expert.
  With `a8` (the default) the activations are quantised per row to e4m3 (`quantize_rows`: x per token before
  gate|up, the SwiGLU output per pair before down; one launch each, `quantize_rows_fused`) and the tiles
  multiply on the FP8 tensor cores (tl.dot fp8 x fp8 -> fp32), both scales applied to the result; `a8=False`
  widens the weight tiles to the activations' dtype in registers instead (model-dtype tensor cores, no
  activation rounding).

Which of the two serves a decode batch of n rows is `DECODE_PLAN`'s choice (`decode_plan`), a table from the
per-layer times `bench/fp8_kernel_bench.py` measures: the GEMVs re-read an expert for every (token, expert) pair
and win at one row, the tensor-core path reads each used expert once per block and wins at 16.

`quantize_rows` is the activation quantisation, and model/fp8.py's per-output-channel weight quantisation
(one row = one output channel). The references are moe.py's PyTorch paths over the dequantised experts;
tests/test_fp8_kernels.py checks each kernel against them.
"""

from __future__ import annotations

import torch

from dataclasses import dataclass, field

from . import pdl
from .moe_decode import MAX_DECODE_TOKENS, decode_fits
from .moe_experts import align_pairs, rows_per_block
from .selection import Kernels
from .triton_import import tl, triton

__all__ = ["FP8", "FP8_MAX", "DECODE_PLAN", "DecodePlan", "amax_scale", "decode_plan", "fused_experts",
           "moe_decode", "quantize_rows", "quantize_rows_fused"]

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
_TINY = 1e-12  # an all-zero row's amax: its scale stays finite, its values 0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (q [..., K] float8_e4m3fn, scale [...] fp32), x ≈ q · scale: each row's amax maps to 448
    (e4m3's largest finite value), values round to nearest even. Computed in fp32 on x's device."""
    x32 = x.float()
    scale = amax_scale(x32.abs().amax(-1))
    return (x32 / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def amax_scale(amax: torch.Tensor) -> torch.Tensor:
    """fp32 amax -> the scale max(amax, 1e-12) / 448, correctly rounded on every device: a tensor divisor, because
    PyTorch's CUDA division by a Python scalar multiplies by its rounded reciprocal (an ulp off at times)."""
    amax = amax.clamp(min=_TINY)
    return amax / torch.full_like(amax, FP8_MAX)


# ---- which path serves a decode batch ---------------------------------------------------------------------

# The GEMVs' tiles per row count (keys: the largest row count an entry serves; gu_/dn_stages, default 1: the loads
# software-pipelined that many stages; dn_all: the down GEMV reads a token's experts in one tile), as
# bench/decode_step_bench.py picked them at the real shapes on one H200, compiled tests green (one MoE layer at 1 row
# 43.7 -> 38.1 us: bench/results/gpu-h200-decode-step-2026-11-29).
_GEMV_TILES = (
    (1, dict(gu_n=2, gu_k=256, gu_warps=2, gu_stages=3, dn_d=4, dn_k=128, dn_warps=2, dn_stages=3, dn_all=1)),
    (2, dict(gu_n=4, gu_k=256, gu_warps=2, gu_stages=3, dn_d=4, dn_k=128, dn_warps=2, dn_stages=3, dn_all=1)),
    (4, dict(gu_n=4, gu_k=512, gu_warps=2, gu_stages=4, dn_d=4, dn_k=128, dn_warps=2, dn_stages=3, dn_all=1)),
    (8, dict(gu_n=4, gu_k=512, gu_warps=2, gu_stages=4, dn_d=4, dn_k=128, dn_warps=2, dn_stages=3, dn_all=1)),
    (MAX_DECODE_TOKENS, dict(gu_n=2, gu_k=256, gu_warps=1, dn_d=2, dn_k=256, dn_warps=1)),
)


@dataclass(frozen=True)
class DecodePlan:
    """Which FP8 expert path serves a decode batch, by row count: `paths` ((max rows, "gemv" | "grouped"), ...)
    ascending (a batch takes the first entry whose bound it fits; above the last, or above MAX_DECODE_TOKENS,
    "grouped"), `gemv_tiles` the same way; `fused_quantize`: the a8 activations quantised in one launch each
    (`quantize_rows_fused`) instead of PyTorch's ~6. Benchmarks A/B plans by replacing `DECODE_PLAN`."""

    paths: tuple[tuple[int, str], ...]
    gemv_tiles: tuple[tuple[int, dict], ...] = _GEMV_TILES
    fused_quantize: bool = True
    grouped: dict = field(default_factory=dict)  # fused_experts tile overrides for decode batches (block_n, ...)

    def path(self, rows: int) -> str:
        if rows > MAX_DECODE_TOKENS:
            return "grouped"
        return next((p for bound, p in self.paths if rows <= bound), "grouped")

    def tiles(self, rows: int) -> dict:
        """The GEMVs' tiles for a batch of `rows`."""
        return dict(next((t for bound, t in self.gemv_tiles if rows <= bound), self.gemv_tiles[-1][1]))

    def grouped_tiles(self, rows: int) -> dict:
        """`fused_experts` tile overrides for a batch of `rows` (decode batches only; prefill takes its defaults)."""
        return dict(self.grouped) if rows <= MAX_DECODE_TOKENS else {}


# Measured on one H200 (TP=1, real shapes, bench/results/gpu-h200-fp8-decode-2026-11-29), us a MoE layer, routed +
# shared experts, tuned GEMVs vs the tensor-core (a8) path: 1 row 40.5 vs 115, 2: 69 vs 135, 4: 122 vs 177,
# 8: 225 vs 257, 16: 580 (untuned) vs 357.
DECODE_PLAN = DecodePlan(paths=((1, "gemv"), (2, "gemv"), (4, "gemv"), (8, "gemv"), (MAX_DECODE_TOKENS, "grouped")))


def decode_plan() -> DecodePlan:
    """The plan in force (module-level, so benchmarks can swap it before graphs are captured)."""
    return DECODE_PLAN


if triton is not None:
    from .moe_experts import block_of_program
    from .pdl import begin, release, wait

    _TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}

    @triton.jit
    def _rows_dot(x_row, g_rows, u_rows, nok, D, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                  g0, u0, PEELED: tl.constexpr):
        """(x . g_n, x . u_n) in fp32 for the BLOCK_N weight rows at g_rows / u_rows ([BLOCK_N, 1] pointers). STAGES > 1
        software-pipelines the loads (async copies STAGES - 1 chunks ahead: more bytes in flight per program).
        PEELED: g0 / u0 hold the rows' first K chunk, loaded before (`_decode_gate_up_kernel` with PDL)."""
        k = tl.arange(0, BLOCK_K)
        acc_g = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        acc_u = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        if PEELED:  # the loop's first step, the same sum order
            x = tl.load(x_row + k, mask=k < D, other=0.0).to(tl.float32)[None, :]
            acc_g += g0.to(tl.float32) * x
            acc_u += u0.to(tl.float32) * x
        for k0 in tl.range(BLOCK_K * PEELED, D, BLOCK_K, num_stages=STAGES):
            kk = k0 + k
            kok = kk < D
            x = tl.load(x_row + kk, mask=kok, other=0.0).to(tl.float32)[None, :]
            wm = nok[:, None] & kok[None, :]
            acc_g += tl.load(g_rows + kk[None, :], mask=wm, other=0.0).to(tl.float32) * x
            acc_u += tl.load(u_rows + kk[None, :], mask=wm, other=0.0).to(tl.float32) * x
        return tl.sum(acc_g, axis=1), tl.sum(acc_u, axis=1)

    @triton.jit
    def _row_dot(a_row, w_rows, nok, reads, I, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                 w0, PEELED: tl.constexpr):
        """a . w_n in fp32 over the first `reads` columns for the BLOCK_D weight rows at w_rows (STAGES, PEELED with
        w0 the rows' first K chunk: `_rows_dot`)."""
        k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_D, BLOCK_K), tl.float32)
        if PEELED:  # the loop's first step (none where reads is 0: a zero act chunk adds +0)
            a = tl.load(a_row + k, mask=(k < I) & (k < reads), other=0.0).to(tl.float32)
            acc += w0.to(tl.float32) * a[None, :]
        for k0 in tl.range(BLOCK_K * PEELED, reads, BLOCK_K, num_stages=STAGES):
            kk = k0 + k
            kok = kk < I
            a = tl.load(a_row + kk, mask=kok, other=0.0).to(tl.float32)
            acc += tl.load(w_rows + kk[None, :], mask=nok[:, None] & kok[None, :], other=0.0).to(tl.float32) * a[None, :]
        return tl.sum(acc, axis=1)

    @triton.jit
    def _decode_gate_up_kernel(x_ptr, ids_ptr, w_ptr, ws_ptr, sg_ptr, su_ptr, act_ptr, live_ptr, D, I, stride_x,
                               stride_we, stride_wn, stride_se, stride_s, TOPK: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, HAS_LIVE: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
        """act[pair, n] = round(silu(round(x.g_n))) * round(x.u_n) for pair = (token, slot); slot TOPK = the shared
        expert (model dtype), the others fp8 rows times their scale. A padding token (live 0) is skipped. PDL
        (pdl.py): the shared expert's programs read its first K chunk before waiting for the kernel before (a
        routed expert's programs cannot: the expert ids are that kernel's output)."""
        release(PDL)
        pair = tl.program_id(0).to(tl.int64)
        tok = pair // (TOPK + 1)
        slot = pair % (TOPK + 1)
        g0 = None
        u0 = None
        if PDL:
            n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            k = tl.arange(0, BLOCK_K)
            rows = n[:, None].to(tl.int64) * stride_s
            wm = ((n < I) & (slot == TOPK))[:, None] & (k < D)[None, :]
            g0 = tl.load(sg_ptr + rows + k[None, :], mask=wm, other=0.0)
            u0 = tl.load(su_ptr + rows + k[None, :], mask=wm, other=0.0)
        wait(PDL)
        if HAS_LIVE:
            if tl.load(live_ptr + tok) == 0:
                return
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nok = n < I
        x_row = x_ptr + tok * stride_x
        if slot == TOPK:
            rows = n[:, None].to(tl.int64) * stride_s
            g, u = _rows_dot(x_row, sg_ptr + rows, su_ptr + rows, nok, D, BLOCK_N, BLOCK_K, STAGES, g0, u0, PDL)
        else:
            e = tl.load(ids_ptr + tok * TOPK + slot).to(tl.int64)
            base = w_ptr + e * stride_we
            g, u = _rows_dot(x_row, base + n[:, None].to(tl.int64) * stride_wn,
                             base + (I + n[:, None]).to(tl.int64) * stride_wn, nok, D, BLOCK_N, BLOCK_K, STAGES, None,
                             None, False)
            g = g * tl.load(ws_ptr + e * stride_se + n, mask=nok, other=0.0)
            u = u * tl.load(ws_ptr + e * stride_se + I + n, mask=nok, other=0.0)
        ty = act_ptr.dtype.element_ty
        g = g.to(ty).to(tl.float32)
        u = u.to(ty).to(tl.float32)
        a = (g * tl.sigmoid(g)).to(ty).to(tl.float32) * u
        tl.store(act_ptr + pair * I + n, a.to(ty), mask=nok)

    @triton.jit
    def _down_program(live_ptr, D, I, BLOCK_D: tl.constexpr, HAS_LIVE: tl.constexpr):
        """A down GEMV program's token, its BLOCK_D output rows (and which exist), and the act columns it reads:
        none for a padding token (live 0: its output is 0)."""
        tok = tl.program_id(0).to(tl.int64)
        n = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        reads = I
        if HAS_LIVE:
            reads = tl.where(tl.load(live_ptr + tok) != 0, I, 0)
        return tok, n, n < D, reads

    @triton.jit
    def _decode_down_kernel(act_ptr, ids_ptr, wts_ptr, w_ptr, ws_ptr, sd_ptr, out_ptr, live_ptr, D, I, stride_we,
                            stride_wn, stride_se, stride_s, stride_o, TOPK: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_K: tl.constexpr, HAS_LIVE: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
        """out[token, n] = round(round(sum_k w_k round(s_e[n] act_k . Wd_e[n])) + round(act_s . Wd_shared[n])); 0 for
        a token with live[token] == 0 (nothing read). PDL (pdl.py): waits first."""
        begin(PDL)
        tok, n, nok, reads = _down_program(live_ptr, D, I, BLOCK_D, HAS_LIVE)
        ty = out_ptr.dtype.element_ty
        rows = n[:, None].to(tl.int64)
        routed = tl.zeros((BLOCK_D,), tl.float32)
        for slot in tl.static_range(TOPK):
            e = tl.load(ids_ptr + tok * TOPK + slot).to(tl.int64)
            y = _row_dot(act_ptr + (tok * (TOPK + 1) + slot) * I, w_ptr + e * stride_we + rows * stride_wn, nok, reads,
                         I, BLOCK_D, BLOCK_K, STAGES, None, False)
            ws = tl.load(ws_ptr + e * stride_se + n, mask=nok, other=0.0)
            if HAS_LIVE:  # a padding token's output is 0 whatever its experts' scales hold
                ws = tl.where(reads > 0, ws, 0.0)
            y = y * ws
            routed += y.to(ty).to(tl.float32) * tl.load(wts_ptr + tok * TOPK + slot)
        shared = _row_dot(act_ptr + (tok * (TOPK + 1) + TOPK) * I, sd_ptr + rows * stride_s, nok, reads, I, BLOCK_D,
                          BLOCK_K, STAGES, None, False)
        out = routed.to(ty).to(tl.float32) + shared.to(ty).to(tl.float32)
        tl.store(out_ptr + tok * stride_o + n, out.to(ty), mask=nok)

    @triton.jit
    def _decode_down_all_kernel(act_ptr, ids_ptr, wts_ptr, w_ptr, ws_ptr, sd_ptr, out_ptr, live_ptr, D, I, stride_we,
                                stride_wn, stride_se, stride_s, stride_o, TOPK: tl.constexpr, TOPK_P: tl.constexpr,
                                BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, HAS_LIVE: tl.constexpr,
                                STAGES: tl.constexpr, PDL: tl.constexpr):
        """`_decode_down_kernel` with the token's TOPK experts read together: one [TOPK_P, BLOCK_D, BLOCK_K] tile a K
        step (TOPK times the bytes in flight of one expert's, one pipelined loop instead of TOPK short ones); each
        expert's dot rounded where the one-expert kernel rounds, the weighted fp32 sum over experts in a tree.
        PDL (pdl.py): the shared expert's first K chunk is read before waiting for the kernel before, and its dot
        done first (the same bits: the two sums are independent until added)."""
        release(PDL)
        if PDL:
            n = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
            k = tl.arange(0, BLOCK_K)
            s0 = tl.load(sd_ptr + n[:, None].to(tl.int64) * stride_s + k[None, :],
                         mask=(n < D)[:, None] & (k < I)[None, :], other=0.0)
        wait(PDL)
        tok, n, nok, reads = _down_program(live_ptr, D, I, BLOCK_D, HAS_LIVE)
        s_act = act_ptr + (tok * (TOPK + 1) + TOPK) * I
        s_rows = sd_ptr + n[:, None].to(tl.int64) * stride_s
        if PDL:
            shared = _row_dot(s_act, s_rows, nok, reads, I, BLOCK_D, BLOCK_K, STAGES, s0, True)
        ty = out_ptr.dtype.element_ty
        slot = tl.arange(0, TOPK_P)
        sok = slot < TOPK
        e = tl.load(ids_ptr + tok * TOPK + slot, mask=sok, other=0).to(tl.int64)
        w_rows = w_ptr + e[:, None, None] * stride_we + n[None, :, None].to(tl.int64) * stride_wn
        a_rows = act_ptr + (tok * (TOPK + 1) + slot[:, None]) * I
        wm = sok[:, None, None] & nok[None, :, None]
        k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((TOPK_P, BLOCK_D, BLOCK_K), tl.float32)
        for k0 in tl.range(0, reads, BLOCK_K, num_stages=STAGES):
            kk = k0 + k
            kok = kk < I
            a = tl.load(a_rows + kk[None, :], mask=sok[:, None] & kok[None, :], other=0.0).to(tl.float32)
            w = tl.load(w_rows + kk[None, None, :], mask=wm & kok[None, None, :], other=0.0).to(tl.float32)
            acc += w * a[:, None, :]
        ws = tl.load(ws_ptr + e[:, None] * stride_se + n[None, :], mask=sok[:, None] & nok[None, :], other=0.0)
        if HAS_LIVE:  # a padding token's output is 0 whatever its experts' scales hold
            ws = tl.where(reads > 0, ws, 0.0)
        y = (tl.sum(acc, axis=2) * ws).to(ty).to(tl.float32)
        routed = tl.sum(y * tl.load(wts_ptr + tok * TOPK + slot, mask=sok, other=0.0)[:, None], axis=0)
        if not PDL:
            shared = _row_dot(s_act, s_rows, nok, reads, I, BLOCK_D, BLOCK_K, STAGES, None, False)
        out = routed.to(ty).to(tl.float32) + shared.to(ty).to(tl.float32)
        tl.store(out_ptr + tok * stride_o + n, out.to(ty), mask=nok)

    @triton.jit(do_not_specialize=['num_pairs'])
    def _gate_up_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, rows_ptr, blocks_ptr, act_ptr, num_pairs, num_experts, top_k, D,
                        I, stride_xm, stride_we, stride_wn, stride_se, stride_am, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, A8: tl.constexpr, PREC: tl.constexpr):
        """act[pair, n] = silu(x·W[e, n]) · (x·W[e, I + n]) for one block of pairs × BLOCK_N columns; fp8 W rows
        scaled by ws[e, ·]; with A8 x is fp8 too (scale xs[token])."""
        e, pair, valid, offs_n, offs_k = block_of_program(rows_ptr, blocks_ptr, num_pairs, BLOCK_M, BLOCK_N, BLOCK_K)
        if e >= num_experts:
            return
        token = tl.where(valid, pair // top_k, 0)
        x_ptrs = x_ptr + token[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
        g_ptrs = w_ptr + e.to(tl.int64) * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        u_ptrs = g_ptrs + I * stride_wn
        n_ok = offs_n < I
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            k_ok = offs_k + k0 < D
            xa = tl.load(x_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            wg = tl.load(g_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            wu = tl.load(u_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if not A8:  # widen the fp8 tiles to the activations' dtype
                wg = wg.to(xa.dtype)
                wu = wu.to(xa.dtype)
            acc_g = tl.dot(xa, wg, acc_g, input_precision=PREC)
            acc_u = tl.dot(xa, wu, acc_u, input_precision=PREC)
            x_ptrs += BLOCK_K
            g_ptrs += BLOCK_K
            u_ptrs += BLOCK_K
        g = acc_g * tl.load(ws_ptr + e.to(tl.int64) * stride_se + offs_n, mask=n_ok, other=0.0)[None, :]
        u = acc_u * tl.load(ws_ptr + e.to(tl.int64) * stride_se + I + offs_n, mask=n_ok, other=0.0)[None, :]
        if A8:
            xs = tl.load(xs_ptr + token, mask=valid, other=0.0)[:, None]
            g = g * xs
            u = u * xs
        out_ty = act_ptr.dtype.element_ty
        g = g.to(out_ty).to(tl.float32)
        u = u.to(out_ty).to(tl.float32)
        a = (g * tl.sigmoid(g)).to(out_ty).to(tl.float32) * u
        a_ptrs = act_ptr + pair[:, None].to(tl.int64) * stride_am + offs_n[None, :]
        tl.store(a_ptrs, a.to(out_ty), mask=valid[:, None] & n_ok[None, :])

    @triton.jit(do_not_specialize=['num_pairs'])
    def _down_kernel(act_ptr, as_ptr, w_ptr, ws_ptr, rows_ptr, blocks_ptr, weight_ptr, y_ptr, num_pairs, num_experts,
                     D, I, stride_am, stride_we, stride_wn, stride_se, stride_ym, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, A8: tl.constexpr, PREC: tl.constexpr,
                     MODEL_TY: tl.constexpr):
        """y[pair, n] = w_pair · round(ws[e, n] act[pair]·W_down[e, n]) in fp32 (act fp8 × as[pair] with A8)."""
        e, pair, valid, offs_n, offs_k = block_of_program(rows_ptr, blocks_ptr, num_pairs, BLOCK_M, BLOCK_N, BLOCK_K)
        if e >= num_experts:
            return
        safe = tl.where(valid, pair, 0)
        a_ptrs = act_ptr + safe[:, None].to(tl.int64) * stride_am + offs_k[None, :]
        w_ptrs = w_ptr + e.to(tl.int64) * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        n_ok = offs_n < D
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            k_ok = offs_k + k0 < I
            a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if not A8:
                w = w.to(a.dtype)
            acc = tl.dot(a, w, acc, input_precision=PREC)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        y = acc * tl.load(ws_ptr + e.to(tl.int64) * stride_se + offs_n, mask=n_ok, other=0.0)[None, :]
        if A8:
            y = y * tl.load(as_ptr + safe, mask=valid, other=0.0)[:, None]
        scale = tl.load(weight_ptr + safe, mask=valid, other=0.0)
        y = y.to(MODEL_TY).to(tl.float32) * scale[:, None]
        tl.store(y_ptr + safe[:, None].to(tl.int64) * stride_ym + offs_n[None, :], y, mask=valid[:, None] & n_ok[None, :])


    @triton.jit
    def _round_e4m3(v):
        """v (fp32, |v| <= 448) rounded to the nearest e4m3 value, ties to even, still in fp32: the e4m3 step at
        v's binade (2^(e-3), subnormals 2^-9) times the RNE-rounded quotient (fp32 adds round to nearest even).
        Converting the result to e4m3 is exact, so no conversion's rounding mode matters (the CPU interpreter's
        fp32 -> fp8 cast mis-rounds a mantissa carry). The sign is v's sign bit, put back with bit operations: -0.0
        and a tiny negative that rounds to zero give -0 as PyTorch does (compiled, `-r` is 0 - r: +0)."""
        bits = v.to(tl.int32, bitcast=True)
        a = (bits & 0x7FFFFFFF).to(tl.float32, bitcast=True)
        e = ((bits >> 23) & 0xFF) - 127
        e = tl.maximum(e, -6) - 3
        step = ((e + 127) << 23).to(tl.float32, bitcast=True)
        inv = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 1 / step, exactly (powers of two)
        r = ((a * inv + 8388608.0) - 8388608.0) * step  # >= +0
        return (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)

    @triton.jit(do_not_specialize=['m'])
    def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, m, K, stride_x, stride_q, BLOCK: tl.constexpr):
        """`quantize_rows` of one row: amax, the scale amax / 448, q = x / scale (IEEE division, round to nearest
        even), so the codes equal PyTorch's bit for bit."""
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        ok = offs < K
        x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
        scale = tl.div_rn(tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12), 448.0)  # amax_scale: _TINY, FP8_MAX
        q = _round_e4m3(tl.minimum(tl.maximum(tl.div_rn(x, scale), -448.0), 448.0))
        tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=ok)
        tl.store(s_ptr + row, scale)


_QUANTIZE_MAX_K = 8192  # one program holds a row


def quantize_rows_fused(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_rows` of x [M, K] in one launch (PyTorch's is ~6), equal to it bit for bit; falls back to it
    where the kernel does not fit (Triton missing, K above 8192, not two-dimensional, unit stride missing)."""
    if triton is None or x.dim() != 2 or x.shape[1] > _QUANTIZE_MAX_K or x.stride(-1) != 1 or not x.numel():
        return quantize_rows(x)
    m, k = x.shape
    q = torch.empty(m, k, device=x.device, dtype=FP8)
    scale = torch.empty(m, device=x.device, dtype=torch.float32)
    block = triton.next_power_of_2(k)
    _quantize_rows_kernel[(m,)](x, q, scale, m, k, x.stride(0), q.stride(0), BLOCK=block,
                                num_warps=min(8, max(1, block // 512)))
    return q, scale


def moe_decode(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
               w_down: torch.Tensor, shared_gate: torch.Tensor, shared_up: torch.Tensor, shared_down: torch.Tensor,
               gate_up_scale: torch.Tensor, down_scale: torch.Tensor, *, kernels: Kernels, tune: dict | None = None,
               live: torch.Tensor | None = None) -> torch.Tensor | None:
    """`moe_decode.moe_decode` over fp8 routed experts: w_gate_up [E, 2I, D] / w_down [E, D, I] float8_e4m3fn with
    scales gate_up_scale [E, 2I] / down_scale [E, D] fp32; the shared expert in x's dtype. x [N, D] -> [N, D] in
    x's dtype, or None when the kernels do not apply. Runs the GEMVs whatever `decode_plan().path(N)` says (the
    caller asks the plan first); their tiles are the plan's for N rows, `tune` overrides them (benchmarks)."""
    if not decode_fits(x, w_gate_up, w_down, shared_gate, shared_up, shared_down, kernels):
        return None
    n, d = x.shape
    k = ids.shape[1]
    inter = w_down.shape[2]
    t = {**decode_plan().tiles(n), **(tune or {})}  # tune: benchmarks
    act = torch.empty(n * (k + 1), inter, device=x.device, dtype=x.dtype)
    has_live = live is not None
    live = live.contiguous() if has_live else x  # an unread pointer when every token is live
    ids = ids.contiguous()
    gate_up_scale, down_scale = gate_up_scale.contiguous(), down_scale.contiguous()
    launch = pdl.launch(x)
    _decode_gate_up_kernel[(n * (k + 1), triton.cdiv(inter, t["gu_n"]))](
        x, ids, w_gate_up, gate_up_scale, shared_gate, shared_up, act, live, d, inter, x.stride(0),
        w_gate_up.stride(0), w_gate_up.stride(1), gate_up_scale.stride(0), shared_gate.stride(0), TOPK=k,
        BLOCK_N=t["gu_n"], BLOCK_K=t["gu_k"], HAS_LIVE=has_live, STAGES=t.get("gu_stages", 1), num_warps=t["gu_warps"],
        **launch)
    out = torch.empty(n, d, device=x.device, dtype=x.dtype)
    together = bool(t.get("dn_all"))  # the token's experts in one tile (`_decode_down_all_kernel`)
    down = _decode_down_all_kernel if together else _decode_down_kernel
    extra = {"TOPK_P": triton.next_power_of_2(k)} if together else {}
    down[(n, triton.cdiv(d, t["dn_d"]))](
        act, ids, weights.float().contiguous(), w_down, down_scale, shared_down, out, live, d, inter,
        w_down.stride(0), w_down.stride(1), down_scale.stride(0), shared_down.stride(0), out.stride(0), TOPK=k,
        BLOCK_D=t["dn_d"], BLOCK_K=min(t["dn_k"], triton.next_power_of_2(inter)), HAS_LIVE=has_live,
        STAGES=t.get("dn_stages", 1), num_warps=t["dn_warps"], **extra, **launch)
    return out


def fused_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
                  w_down: torch.Tensor, gate_up_scale: torch.Tensor, down_scale: torch.Tensor, *, a8: bool = True,
                  block_n: int = 64, block_k: int = 128, num_warps: int = 4, num_stages: int = 3,
                  fused_quantize: bool | None = None) -> torch.Tensor:
    """`moe_experts.fused_experts` over fp8 experts (scales as `moe_decode`): x [N, D] -> [N, D] fp32.

    a8: activations quantised per row to e4m3 and fp8 x fp8 tensor-core dots (else fp8 weights widened to x's
    dtype in registers). fused_quantize (None: the plan's `fused_quantize`): that quantisation in one launch per
    tensor (`quantize_rows_fused`, the same codes) instead of PyTorch's ops."""
    if triton is None:
        raise RuntimeError("moe_fp8.fused_experts needs Triton")
    if w_gate_up.stride(-1) != 1 or w_down.stride(-1) != 1:
        raise ValueError("expert weights must be contiguous in their last dim")
    n, k = ids.shape
    e, two_i, d = w_gate_up.shape
    inter = two_i // 2
    x = x.contiguous()
    pairs = n * k
    block_m = rows_per_block(pairs, e)
    rows, blocks = align_pairs(ids, e, block_m)
    if fused_quantize is None:
        fused_quantize = decode_plan().fused_quantize
    quantize = quantize_rows_fused if fused_quantize else quantize_rows
    xq, xs = quantize(x) if a8 else (x, x)  # x: an unread scale pointer
    prec = "ieee" if not a8 and x.dtype == torch.float32 else None  # fp32 stays exact (no TF32)
    gate_up_scale, down_scale = gate_up_scale.contiguous(), down_scale.contiguous()
    act = torch.empty(pairs, inter, device=x.device, dtype=x.dtype)
    tiles = dict(BLOCK_M=block_m, BLOCK_N=block_n, A8=a8, PREC=prec, num_warps=num_warps, num_stages=num_stages)
    _gate_up_kernel[(blocks.numel(), triton.cdiv(inter, block_n))](
        xq, xs, w_gate_up, gate_up_scale, rows, blocks, act, pairs, e, k, d, inter, xq.stride(0), w_gate_up.stride(0),
        w_gate_up.stride(1), gate_up_scale.stride(0), act.stride(0), BLOCK_K=block_k, **tiles)
    aq, as_ = quantize(act) if a8 else (act, act)
    y = torch.empty(pairs, d, device=x.device, dtype=torch.float32)
    _down_kernel[(blocks.numel(), triton.cdiv(d, block_n))](
        aq, as_, w_down, down_scale, rows, blocks, weights.reshape(-1).float().contiguous(), y, pairs, e, d, inter,
        aq.stride(0), w_down.stride(0), w_down.stride(1), down_scale.stride(0), y.stride(0),
        BLOCK_K=min(block_k, max(32, triton.next_power_of_2(inter))), MODEL_TY=_TL_DTYPES[x.dtype], **tiles)
    return y.view(n, k, d).sum(1)
