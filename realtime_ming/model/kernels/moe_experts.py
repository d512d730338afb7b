"""Fused MoE experts for CUDA (Triton): the math of `moe.experts_gathered`, no weight copies, no host sync.

Same function as docs/model.md §1.4 / `BailingMoeV2SparseMoeBlock`'s expert part (moe.py):
y = Σ_k w_k · down_e(silu(gate_e(x)) · up_e(x)) over the stacked [E, 2I, D] / [E, D, I] weights.
(token, expert) pairs are sorted by expert on the device and padded to blocks of BLOCK_M rows of
one expert (static worst-case block count, so shapes never depend on the routing); kernel 1 reads
each used expert's gate|up tiles once per block and writes silu(g)·u, kernel 2 applies down and
the routing weight. Decode (few pairs) and prefill (many) share the kernels; only BLOCK_M differs.
A model runs it where its `Kernels.moe_experts` is selected (`SparseMoeBlock`, CUDA tensors).
"""

from __future__ import annotations

import torch

from .triton_import import tl, triton

__all__ = ["align_pairs", "block_of_program", "fused_experts", "rows_per_block"]


def rows_per_block(num_pairs: int, num_experts: int) -> int:
    """Rows per block: 16 (tensor-core minimum) while experts average < 4 pairs, else 64."""
    return 16 if num_pairs <= 4 * num_experts else 64


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort pairs by expert into padded blocks, sync-free: ids [N, k] -> (pair_of_row, expert_of_block).

    pair_of_row [max_blocks·block_m] int32: flat pair index (token·k + slot) or N·k for padding;
    expert_of_block [max_blocks] int32: the expert a block belongs to, num_experts for unused blocks.
    max_blocks = ceil(N·k / block_m) + min(N·k, E) bounds Σ_e ceil(count_e / block_m).
    """
    flat = ids.reshape(-1)
    pairs = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would sync to size its output
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = padded.cumsum(0)
    order = flat.argsort(stable=True)
    expert = flat[order]
    rank = torch.arange(pairs, device=device) - (counts.cumsum(0) - counts)[expert]
    dest = (pad_end - padded)[expert] + rank
    max_blocks = -(-pairs // block_m) + min(pairs, num_experts)
    pair_of_row = torch.full((max_blocks * block_m,), pairs, dtype=torch.int32, device=device)
    pair_of_row.scatter_(0, dest, order.to(torch.int32))
    starts = torch.arange(max_blocks, device=device) * block_m
    expert_of_block = torch.searchsorted(pad_end, starts, right=True).to(torch.int32)
    return pair_of_row, expert_of_block


if triton is not None:

    @triton.jit
    def block_of_program(rows_ptr, blocks_ptr, num_pairs,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """This program's tile: its block's expert (num_experts for an unused block), the block's pairs
        (`num_pairs` for padding), which of them are real, its BLOCK_N output columns and the K offsets."""
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        e = tl.load(blocks_ptr + pid_m)
        pair = tl.load(rows_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pair < num_pairs
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        return e, pair, valid, offs_n, offs_k

    @triton.jit(do_not_specialize=['num_pairs'])
    def _gate_up_kernel(x_ptr, w_ptr, rows_ptr, blocks_ptr, act_ptr, num_pairs, num_experts, top_k, D, I,
                        stride_xm, stride_we, stride_wn, stride_am,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr):
        """act[pair, n] = silu(x·W[e, n]) · (x·W[e, I + n]) for one block of pairs × BLOCK_N columns."""
        e, pair, valid, offs_n, offs_k = block_of_program(rows_ptr, blocks_ptr, num_pairs, BLOCK_M, BLOCK_N, BLOCK_K)
        if e >= num_experts:
            return
        token = tl.where(valid, pair // top_k, 0)
        x_ptrs = x_ptr + token[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
        w_base = w_ptr + e.to(tl.int64) * stride_we
        g_ptrs = w_base + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        u_ptrs = g_ptrs + I * stride_wn
        n_ok = offs_n < I
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            k_ok = offs_k + k0 < D
            xa = tl.load(x_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            wg = tl.load(g_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            wu = tl.load(u_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc_g = tl.dot(xa, wg, acc_g, input_precision=PREC)
            acc_u = tl.dot(xa, wu, acc_u, input_precision=PREC)
            x_ptrs += BLOCK_K
            g_ptrs += BLOCK_K
            u_ptrs += BLOCK_K
        out_ty = act_ptr.dtype.element_ty
        # round like the reference: h in the model dtype, silu(gate) in the model dtype, then × up
        g = acc_g.to(out_ty).to(tl.float32)
        u = acc_u.to(out_ty).to(tl.float32)
        a = (g * tl.sigmoid(g)).to(out_ty).to(tl.float32) * u
        a_ptrs = act_ptr + pair[:, None].to(tl.int64) * stride_am + offs_n[None, :]
        tl.store(a_ptrs, a.to(out_ty), mask=valid[:, None] & n_ok[None, :])

    @triton.jit(do_not_specialize=['num_pairs'])
    def _down_kernel(act_ptr, w_ptr, rows_ptr, blocks_ptr, weight_ptr, y_ptr, num_pairs, num_experts, D, I,
                     stride_am, stride_we, stride_wn, stride_ym,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr):
        """y[pair, n] = w_pair · round(act[pair]·W_down[e, n]) in fp32, for one block × BLOCK_N outputs."""
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
            acc = tl.dot(a, w, acc, input_precision=PREC)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        scale = tl.load(weight_ptr + safe, mask=valid, other=0.0)
        y = acc.to(act_ptr.dtype.element_ty).to(tl.float32) * scale[:, None]
        y_ptrs = y_ptr + safe[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, y, mask=valid[:, None] & n_ok[None, :])


def fused_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
                  w_down: torch.Tensor, *, block_n: int = 64, block_k: int = 128, num_warps: int = 4,
                  num_stages: int = 3) -> torch.Tensor:
    """Drop-in for `moe.experts_gathered` / `experts_grouped`: x [N, D] -> [N, D] fp32.

    ids [N, k] int64, weights [N, k] fp32, w_gate_up [E, 2I, D], w_down [E, D, I] (contiguous).
    """
    if triton is None:
        raise RuntimeError("moe_experts.fused_experts needs Triton")
    n, k = ids.shape
    e, two_i, d = w_gate_up.shape
    inter = two_i // 2
    x = x.contiguous()
    pairs = n * k
    block_m = rows_per_block(pairs, e)
    rows, blocks = align_pairs(ids, e, block_m)
    if w_gate_up.stride(-1) != 1 or w_down.stride(-1) != 1:
        raise ValueError("expert weights must be contiguous in their last dim")
    prec = "ieee" if x.dtype == torch.float32 else None  # fp32 stays exact (no TF32)
    act = torch.empty(pairs, inter, device=x.device, dtype=x.dtype)
    grid = (blocks.numel(), triton.cdiv(inter, block_n))
    _gate_up_kernel[grid](x, w_gate_up, rows, blocks, act, pairs, e, k, d, inter,
                          x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), act.stride(0),
                          BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PREC=prec,
                          num_warps=num_warps, num_stages=num_stages)
    y = torch.empty(pairs, d, device=x.device, dtype=torch.float32)
    grid = (blocks.numel(), triton.cdiv(d, block_n))
    _down_kernel[grid](act, w_down, rows, blocks, weights.reshape(-1).float().contiguous(), y, pairs, e, d, inter,
                       act.stride(0), w_down.stride(0), w_down.stride(1), y.stride(0),
                       BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=min(block_k, max(16, triton.next_power_of_2(inter))),
                       PREC=prec, num_warps=num_warps, num_stages=num_stages)
    return y.view(n, k, d).sum(1)
