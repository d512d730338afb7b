"""Fused kernels for the per-token elementwise work of every model (Triton on CUDA, the reference elsewhere).

At serving batch sizes the talker step, the thinker decode step and the VAE chunk are bound by
kernel launches, not by bytes: a reference RMSNorm is six kernels, a rotary embedding eight to
twelve, each a few microseconds even inside a CUDA graph (the `talker_profile` stage of
`bench/gpu_bench.py` counts the kernels per talker step, graphed and eager). Each function here
is one kernel on CUDA and exactly the reference PyTorch math otherwise (the CPU path the fixtures
check). The kernels round where the reference rounds (to the activation dtype after
the norm, after each rotary product, ...), so bf16 results agree with the reference to an ulp.

Integer arguments that change from call to call (rows, tokens) are `do_not_specialize`: Triton would
otherwise compile a new variant the first time a length is 1 or a multiple of 16, a ~1 s stall in the
middle of serving.

Dispatch: `use_triton(t)` is true for CUDA tensors when Triton imports and `set_enabled(False)` has
not been called (benchmarks A/B the two paths). With TRITON_INTERPRET=1 set before Triton is
imported, the same kernels also run on CPU tensors (`force=True`), which is how CI tests them.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:  # the GPU machines have Triton; CPU-only installs may not
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU-only machines
    triton = None

__all__ = [
    "available",
    "interpreting",
    "set_enabled",
    "use_triton",
    "interpret_on_cpu",
    "enabled_on",
    "configure_cuda",
    "attention_any_length",
    "rms_norm",
    "add_rms_norm",
    "head_rotary",
    "RotaryStyle",
    "silu_mul",
    "rotate_half",
    "apply_rotary",
    "apply_interleaved_rotary",
]

_ENABLED = True


def available() -> bool:
    return triton is not None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, tests)."""
    return triton is not None and os.environ.get("TRITON_INTERPRET") == "1"


def set_enabled(on: bool) -> None:
    """Turn the fused CUDA kernels on or off process-wide (off = the reference PyTorch ops)."""
    global _ENABLED
    _ENABLED = bool(on)


def enabled_on(device: torch.device | str) -> bool:
    """True when CUDA tensors on `device` take the fused kernels."""
    return triton is not None and _ENABLED and torch.device(device).type == "cuda"


_ANY_LENGTH_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_any_length(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                         enable_gqa: bool = False) -> torch.Tensor:
    """`F.scaled_dot_product_attention` for inputs whose length changes from call to call (audio and
    vision encoders, thinker prefill): cuDNN's backend is left out, since it builds an execution plan
    for every new shape, 50-130 ms each (measured on an H200: the audio encoder's first call at each
    clip length), which a server would pay on nearly every turn. Flash and memory-efficient attention
    serve any length at once. Fixed-shape graphed paths (talker LM decode, DiT, VAE chunk) keep cuDNN,
    whose plans are built once at capture and are faster there.

    Grouped K/V with a mask (thinker prefill) has no fused kernel in PyTorch: it fell back to the math
    backend, in fp32 (on an H200 ~9 ms of a 41 ms 128-token prefill). K/V expanded to every query
    head (head h reads kv head h // group, as `enable_gqa` does) take the memory-efficient kernel."""
    if enable_gqa and attn_mask is not None and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
        enable_gqa = False
    with sdpa_kernel(_ANY_LENGTH_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=enable_gqa)


def configure_cuda() -> None:
    """Process-wide CUDA kernel choices for serving (the engine and every tensor-parallel worker call it):
    the fused Triton MoE experts (`moe_triton`) for prefill-sized batches."""
    from . import moe_triton

    if moe_triton.available():
        moe_triton.enable()


def use_triton(t: torch.Tensor, force: bool = False) -> bool:
    if triton is None or not _ENABLED:
        return False
    return t.is_cuda or ((force or _ON_CPU) and interpreting())


_ON_CPU = False


@contextlib.contextmanager
def interpret_on_cpu():
    """Within: CPU tensors take the kernels too, in Triton's interpreter (TRITON_INTERPRET=1), so a
    whole model's fused path can be compared with its reference path on a machine without a GPU."""
    global _ON_CPU
    if not interpreting():
        raise RuntimeError("interpret_on_cpu needs Triton imported with TRITON_INTERPRET=1")
    previous, _ON_CPU = _ON_CPU, True
    try:
        yield
    finally:
        _ON_CPU = previous


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


# ---- RMSNorm -------------------------------------------------------------------------------------

def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Qwen2 / BailingMoeV2: normalise in fp32, cast back to x's dtype, then times the weight."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


if triton is not None:

    @triton.jit(do_not_specialize=['m'])
    def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, m, n, eps, stride_x, stride_r, stride_y, stride_s,
                         HAS_RES: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
        """y = w * round(s * rsqrt(mean(s^2) + eps)) with s = round(x + r) (or x) for ROWS rows; s stored
        when HAS_RES."""
        row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
        offs = tl.arange(0, BLOCK)[None, :]
        ok = (row < m) & (offs < n)
        ty = y_ptr.dtype.element_ty
        s = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
        if HAS_RES:
            s = s + tl.load(r_ptr + row * stride_r + offs, mask=ok, other=0.0).to(tl.float32)
            s = s.to(ty).to(tl.float32)
            tl.store(s_ptr + row * stride_s + offs, s.to(ty), mask=ok)
        rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=1) / n + eps)
        xn = (s * rstd[:, None]).to(ty).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_y + offs, (w * xn).to(ty), mask=ok)


def _norm_launch(x: torch.Tensor, r: torch.Tensor | None, weight: torch.Tensor, eps: float):
    xs = _rows(x)
    if xs.stride(-1) != 1:
        xs = xs.contiguous()
    n = xs.shape[-1]
    y = torch.empty(xs.shape, device=x.device, dtype=x.dtype)
    if r is None:
        rs, s = xs, y
    else:
        rs = _rows(r)
        if rs.stride(-1) != 1:
            rs = rs.contiguous()
        s = torch.empty_like(y)
    block = triton.next_power_of_2(n)
    rows = max(1, min(16, 2048 // block))  # several short rows per program
    m = xs.shape[0]
    _rms_norm_kernel[(triton.cdiv(m, rows),)](xs, rs, weight, y, s, m, n, eps, xs.stride(0), rs.stride(0),
                                              y.stride(0), s.stride(0), HAS_RES=r is not None, ROWS=rows,
                                              BLOCK=block, num_warps=4 if block * rows <= 2048 else 8)
    return y.view(x.shape), s.view(x.shape)


def _fusable_norm(x: torch.Tensor, weight: torch.Tensor, force: bool) -> bool:
    return use_triton(x, force) and x.dtype == weight.dtype and x.shape[-1] <= 16384 and x.numel() > 0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, force: bool = False) -> torch.Tensor:
    """RMSNorm over the last dim (reference math; one kernel on CUDA)."""
    if not _fusable_norm(x, weight, force):
        return rms_norm_reference(x, weight, eps)
    return _norm_launch(x, None, weight, eps)[0]


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 force: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + delta), x + delta): the residual add of a pre-norm block fused into the next norm."""
    if not _fusable_norm(x, weight, force) or delta.shape != x.shape or delta.dtype != x.dtype:
        s = x + delta
        return rms_norm_reference(s, weight, eps), s
    return _norm_launch(x, delta, weight, eps)


# ---- per-head norm + rotary + layout (+ K/V cache write) -------------------------------------------

def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """NeoX pairing: dim i pairs with dim i + d/2."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the last dim of `x` (cos/sin broadcastable, same last dim), in x's dtype."""
    return x * cos + rotate_half(x) * sin


def apply_interleaved_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x0, x1), (x2, x3), ... of the last dim by fp32 tables; fp32 math, cast back (GPT-J style)."""
    xf = x.float()
    pairs = xf.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return (xf * cos + rotated * sin).to(x.dtype)


class RotaryStyle:
    """How a model rotates: NeoX rotate-half (Qwen2, thinker) or interleaved pairs (DiT, GPT-J);
    rounded to the activation dtype after every product (ROUND_EACH, HF style) or computed in fp32
    and rounded once (FP32)."""

    NEOX_ROUND_EACH = (0, True)
    INTERLEAVED_FP32 = (1, False)


if triton is not None:

    @triton.jit(do_not_specialize=['T'])
    def _head_rotary_kernel(qkv_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, q_ptr, k_ptr, v_ptr, rows_ptr, idx_ptr,
                            T, H, KV, eps,
                            stride_qkv, stride_cb, stride_ct,
                            sq_b, sq_h, sq_t, sk_r, sk_h, sk_s,
                            HD: tl.constexpr, RD: tl.constexpr, BLOCK: tl.constexpr, HEADS: tl.constexpr,
                            INTERLEAVED: tl.constexpr, ROUND_EACH: tl.constexpr, QK_NORM: tl.constexpr,
                            HAS_ROWS: tl.constexpr, HAS_IDX: tl.constexpr):
        """One token: norm (optional) and rotate the first RD dims of its H query and KV key heads, copy
        its KV value heads. Rows j < H of the [HEADS, BLOCK] tile are query heads, H <= j < H + KV keys."""
        tok = tl.program_id(0).to(tl.int64)
        b = tok // T
        t = tok % T
        ty = q_ptr.dtype.element_ty
        j = tl.arange(0, HEADS)[:, None]
        d = tl.arange(0, BLOCK)[None, :]
        is_q = j < H
        live = (j < H + KV) & (d < HD)
        src = qkv_ptr + tok * stride_qkv + j * HD  # q heads, then k heads, in the fused row
        x = tl.load(src + d, mask=live, other=0.0).to(tl.float32)
        if INTERLEAVED:
            partner = d ^ 1
            sign = tl.where(d % 2 == 0, -1.0, 1.0)
        else:
            half = RD // 2
            partner = tl.where(d < half, d + half, d - half)
            sign = tl.where(d < half, -1.0, 1.0)
        rot = d < RD
        xp = tl.load(src + partner, mask=live & rot, other=0.0).to(tl.float32)
        if QK_NORM:
            dd = d + j * 0
            w = tl.where(is_q, tl.load(qw_ptr + dd, mask=live, other=0.0), tl.load(kw_ptr + dd, mask=live, other=0.0))
            pp = partner + j * 0
            wp = tl.where(is_q, tl.load(qw_ptr + pp, mask=live & rot, other=0.0),
                          tl.load(kw_ptr + pp, mask=live & rot, other=0.0))
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HD + eps)[:, None]
            x = (w.to(tl.float32) * (x * rstd).to(ty).to(tl.float32)).to(ty).to(tl.float32)
            xp = (wp.to(tl.float32) * (xp * rstd).to(ty).to(tl.float32)).to(ty).to(tl.float32)
        c = tl.load(cos_ptr + b * stride_cb + t * stride_ct + d, mask=(d < RD), other=1.0).to(tl.float32)
        s = tl.load(sin_ptr + b * stride_cb + t * stride_ct + d, mask=(d < RD), other=0.0).to(tl.float32)
        if ROUND_EACH:
            y = (x * c).to(ty).to(tl.float32) + (sign * xp * s).to(ty).to(tl.float32)
        else:
            y = x * c + sign * xp * s
        y = tl.where(rot, y, x).to(ty)
        tl.store(q_ptr + b * sq_b + j * sq_h + t * sq_t + d, y, mask=live & is_q)
        if HAS_ROWS:
            r = tl.load(rows_ptr + b)
        else:
            r = b
        if HAS_IDX:
            p = tl.load(idx_ptr + tok)
        else:
            p = t
        kvh = tl.where(is_q, 0, j - H)
        is_k = live & (j >= H)
        dst = r * sk_r + kvh * sk_h + p * sk_s + d
        tl.store(k_ptr + dst, y, mask=is_k)
        v = tl.load(src + KV * HD + d, mask=is_k, other=0.0)  # the v head sits KV heads after its k head
        tl.store(v_ptr + dst, v, mask=is_k)


def head_rotary_reference(qkv, heads, kv_heads, head_dim, cos, sin, style, q_norm=None, k_norm=None, eps=1e-6):
    """Split a fused projection [B, T, (H + 2KV)·hd] into q [B, H, T, hd], k, v [B, KV, T, hd]; norm and rotate q, k.

    cos/sin [.., T, rd] broadcastable to [B, 1, T, rd] (rd <= hd: the first rd dims rotate).
    """
    b, t, _ = qkv.shape
    q, k, v = qkv.view(b, t, heads + 2 * kv_heads, head_dim).split([heads, kv_heads, kv_heads], dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if q_norm is not None:
        q, k = rms_norm_reference(q, q_norm, eps), rms_norm_reference(k, k_norm, eps)
    rd = cos.shape[-1]
    if cos.dim() == 2:
        cos, sin = cos[None, None], sin[None, None]
    elif cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    rot = apply_interleaved_rotary if style == RotaryStyle.INTERLEAVED_FP32 else apply_rotary
    if rd == head_dim:
        return rot(q, cos, sin), rot(k, cos, sin), v
    return (torch.cat((rot(q[..., :rd], cos, sin), q[..., rd:]), dim=-1),
            torch.cat((rot(k[..., :rd], cos, sin), k[..., rd:]), dim=-1), v)


def head_rotary(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor,
                style, *, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None, eps: float = 1e-6,
                k_out: torch.Tensor | None = None, v_out: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                index: torch.Tensor | None = None, force: bool = False):
    """q [B, H, T, hd] (and k, v) from a fused projection qkv [B, T, (H + 2KV)·hd].

    cos/sin: [T, rd] (shared by the batch) or [B, T, rd] / [B, 1, T, rd]; the first rd dims of each q/k
    head rotate (`style`), after a per-head RMSNorm when q_norm/k_norm are given (thinker). Without
    k_out the function returns (q, k, v) with k, v [B, KV, T, hd]. With k_out/v_out (caches
    [R, KV, S, hd]) k and v are written at [rows[b], :, index[b, t]] (rows default b, index default t)
    and (q, None, None) is returned.
    """
    b, t, width = qkv.shape
    if not use_triton(qkv, force) or width != (heads + 2 * kv_heads) * head_dim:
        q, k, v = head_rotary_reference(qkv, heads, kv_heads, head_dim, cos, sin, style, q_norm, k_norm, eps)
        if k_out is None:
            return q, k, v
        _scatter_cache(k_out, v_out, k, v, rows, index)
        return q, None, None
    qkv = qkv if qkv.stride(-1) == 1 and qkv.stride(0) == t * qkv.stride(1) else qkv.contiguous()
    rd = cos.shape[-1]
    if cos.dim() == 4:
        cos, sin = cos[:, 0], sin[:, 0]
    if cos.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    stride_cb = 0 if cos.dim() == 2 else cos.stride(0)
    stride_ct = cos.stride(-2)
    q = torch.empty(b, heads, t, head_dim, device=qkv.device, dtype=qkv.dtype)
    returned = k_out is None
    if returned:
        k_out = torch.empty(b, kv_heads, t, head_dim, device=qkv.device, dtype=qkv.dtype)
        v_out = torch.empty_like(k_out)
    norm = q_norm is not None
    interleaved, round_each = style
    _head_rotary_kernel[(b * t,)](
        qkv, cos, sin, q_norm if norm else qkv, k_norm if norm else qkv, q, k_out, v_out,
        rows if rows is not None else qkv, index if index is not None else qkv,
        t, heads, kv_heads, eps, qkv.stride(1), stride_cb, stride_ct,
        q.stride(0), q.stride(1), q.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
        HD=head_dim, RD=rd, BLOCK=triton.next_power_of_2(head_dim), HEADS=triton.next_power_of_2(heads + kv_heads),
        INTERLEAVED=bool(interleaved), ROUND_EACH=bool(round_each), QK_NORM=norm, HAS_ROWS=rows is not None,
        HAS_IDX=index is not None, num_warps=4)
    return (q, k_out, v_out) if returned else (q, None, None)


def _scatter_cache(k_out, v_out, k, v, rows, index) -> None:
    """Reference cache write: k, v [B, KV, T, hd] into [R, KV, S, hd] at [rows[b], :, index[b, t]]."""
    b, kvh, t, hd = k.shape
    r = rows if rows is not None else torch.arange(b, device=k.device)
    idx = index if index is not None else torch.arange(t, device=k.device).expand(b, t)
    where = (r[:, None, None], torch.arange(kvh, device=k.device)[None, :, None], idx[:, None, :])
    k_out.index_put_(where, k)
    v_out.index_put_(where, v)


# ---- SwiGLU ----------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _silu_mul_kernel(x_ptr, y_ptr, n, stride_x, stride_y, BLOCK: tl.constexpr):
        """y = round(round(silu(gate)) * up) for one row of x = [gate | up]."""
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = col < n
        ty = y_ptr.dtype.element_ty
        g = tl.load(x_ptr + row * stride_x + col, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * stride_x + n + col, mask=ok, other=0.0).to(tl.float32)
        a = (g / (1.0 + tl.exp(-g))).to(ty).to(tl.float32)
        tl.store(y_ptr + row * stride_y + col, (a * u).to(ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, *, force: bool = False) -> torch.Tensor:
    """silu(gate) * up for gate_up = [..., gate | up] (the two halves of a fused projection)."""
    n = gate_up.shape[-1] // 2
    if not use_triton(gate_up, force):
        gate, up = gate_up.split(n, dim=-1)
        return F.silu(gate) * up
    xs = _rows(gate_up)
    if xs.stride(-1) != 1:
        xs = xs.contiguous()
    y = torch.empty(*gate_up.shape[:-1], n, device=gate_up.device, dtype=gate_up.dtype)
    block = min(1024, triton.next_power_of_2(n))
    _silu_mul_kernel[(xs.shape[0], triton.cdiv(n, block))](xs, y, n, xs.stride(0), n, BLOCK=block, num_warps=4)
    return y
