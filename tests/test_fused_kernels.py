"""model.kernels (norm, rotary, swiglu, sdpa, dit_attention, cfm_step): every Triton kernel equals the
reference PyTorch math it replaces.

On a GPU machine the kernels run compiled on CUDA tensors; elsewhere they run in Triton's CPU
interpreter (conftest sets TRITON_INTERPRET=1), so CI checks the same kernel code. bf16 results
may differ from the reference by rounding-order ulps only; fp32 results agree to 1e-5.
"""

from __future__ import annotations

import pytest
import torch
from kernel_support import DEVICE, DTYPES, NEEDS_TRITON, ON

from realtime_ming.model.kernels import REFERENCE, TRITON, Kernels, select_kernels
from realtime_ming.model.kernels.norm import add_rms_norm, rms_norm, rms_norm_reference
from realtime_ming.model.kernels.rotary import RotaryStyle, head_rotary, head_rotary_reference
from realtime_ming.model.kernels.swiglu import silu_mul

pytestmark = NEEDS_TRITON


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    elif DEVICE == "cuda":  # two bf16 ulps (a norm's reduction order may flip a rounding), absolute: one ulp
        # at magnitude 1, for sums that cancel (a rotary output is x·cos + rot(x)·sin, each rounded)
        torch.testing.assert_close(got.float(), want.float(), atol=2 ** -8, rtol=2 ** -7)
    else:  # the interpreter truncates fp32 -> bf16 (the GPU rounds to nearest): a few ulps per chain
        torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=2 ** -5)


def _randn(*shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [64, 96, 896])
def test_rms_norm(dtype, dim):
    x = _randn(3, 5, dim, dtype=dtype) * 3
    w = 1 + 0.1 * _randn(dim, dtype=dtype, seed=1)
    _close(rms_norm(x, w, 1e-6, kernels=ON), rms_norm_reference(x, w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_returns_norm_and_sum(dtype):
    x, d = _randn(4, 7, 128, dtype=dtype), _randn(4, 7, 128, dtype=dtype, seed=2)
    w = 1 + 0.1 * _randn(128, dtype=dtype, seed=1)
    y, s = add_rms_norm(x, d, w, 1e-6, kernels=ON)
    _close(s, x + d)
    _close(y, rms_norm_reference(x + d, w, 1e-6))


def _tables(b, t, rd, dtype, batched=True):
    pos = torch.arange(t, dtype=torch.float32, device=DEVICE) + 3
    freqs = pos[:, None] * (1.0 / 10000 ** (torch.arange(0, rd, 2, device=DEVICE).float() / rd))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if batched:
        cos, sin = cos.expand(b, 1, t, rd), sin.expand(b, 1, t, rd)
    return cos.to(dtype).contiguous(), sin.to(dtype).contiguous()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model", ["qwen2", "dit"])
def test_head_rotary_returns_q_k_v(dtype, model):
    """Talker LM / VAE (qwen2): full-head NeoX rotary in the activation dtype, GQA, per-token tables.
    DiT / aggregator: interleaved pairs, fp32 tables shared by the batch, one rounding."""
    if model == "qwen2":
        b, t, h, kv, hd = 2, 5, 4, 2, 64
        cos, sin = _tables(b, t, hd, dtype)
        style = RotaryStyle.NEOX_ROUND_EACH
    else:
        b, t, h, kv, hd = 3, 6, 4, 4, 64
        cos, sin = _tables(b, t, hd, torch.float32, batched=False)
        style = RotaryStyle.INTERLEAVED_FP32
    qkv = _randn(b, t, (h + 2 * kv) * hd, dtype=dtype)
    got = head_rotary(qkv, h, kv, hd, cos, sin, style, kernels=ON)
    want = head_rotary_reference(qkv, h, kv, hd, cos, sin, style)
    for g, w in zip(got, want):
        _close(g, w.contiguous())


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_rotary_thinker_qk_norm_partial_into_cache(dtype):
    """Thinker: per-head q/k RMSNorm, rotary on the first half of the head, k/v written into a slot cache."""
    b, t, h, kv, hd, rd = 2, 3, 4, 2, 128, 64
    qkv = _randn(b, t, (h + 2 * kv) * hd, dtype=dtype)
    qn, kn = 1 + 0.1 * _randn(hd, dtype=dtype, seed=3), 1 + 0.1 * _randn(hd, dtype=dtype, seed=4)
    cos, sin = _tables(b, t, rd, dtype)
    rows = torch.tensor([3, 1], device=DEVICE)
    index = torch.tensor([[5, 6, 7], [0, 1, 9]], device=DEVICE)  # 9 = the sink column
    style = RotaryStyle.NEOX_ROUND_EACH
    caches = [torch.zeros(5, kv, 10, hd, device=DEVICE, dtype=dtype) for _ in range(4)]
    q, k_none, _ = head_rotary(qkv, h, kv, hd, cos, sin, style, q_norm=qn, k_norm=kn, k_out=caches[0],
                               v_out=caches[1], rows=rows, index=index, kernels=ON)
    q_ref, _, _ = head_rotary(qkv, h, kv, hd, cos, sin, style, q_norm=qn, k_norm=kn, k_out=caches[2],
                              v_out=caches[3], rows=rows, index=index, kernels=REFERENCE)
    assert k_none is None
    _close(q, q_ref.contiguous())
    _close(caches[0], caches[2])
    _close(caches[1], caches[3])
    assert caches[0][3, :, 5:8].abs().sum() > 0 and caches[0][0].abs().sum() == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    x = _randn(2, 3, 2 * 200, dtype=dtype)
    gate, up = x.split(200, dim=-1)
    _close(silu_mul(x, kernels=ON), torch.nn.functional.silu(gate) * up)


def test_reference_selection_runs_the_reference_ops():
    """`REFERENCE` never takes a kernel; the Triton selection does on this machine's tensors (CUDA, or CPU in
    the interpreter) and `TRITON` without the interpreter flag never on CPU tensors (benchmarks A/B the two)."""
    x = _randn(2, 64, dtype=torch.float32)
    w = torch.ones(64, device=DEVICE)
    assert not REFERENCE.applies(x) and not REFERENCE.on_device(DEVICE) and not REFERENCE.experts_apply(x)
    assert ON.applies(x)
    assert TRITON.applies(x) == (DEVICE == "cuda") and TRITON.applies(x.cpu()) is False
    assert TRITON.on_device("cpu") is False and TRITON.experts_apply(x.cpu()) is False
    assert torch.equal(rms_norm(x, w, 1e-6, kernels=REFERENCE), rms_norm_reference(x, w, 1e-6))
    _close(rms_norm(x, w, 1e-6, kernels=ON), rms_norm_reference(x, w, 1e-6))


def test_a_selection_is_checked_and_frozen():
    with pytest.raises(ValueError, match="needs triton=True"):
        Kernels(cpu_interpreter=True)
    with pytest.raises(AttributeError):
        TRITON.triton = False
    assert Kernels(triton=True, moe_experts=True) == TRITON and hash(TRITON) == hash(Kernels(True, True))


def test_modules_keep_the_selection_they_were_built_with():
    """Two models built with different selections run side by side (no process-wide switch);
    `select_kernels` re-selects every module of one model, and only that model."""
    from realtime_ming.model.dit import DiT
    from realtime_ming.model.presets import preset_config
    from realtime_ming.model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_talker_special_ids, tiny_thinker_special_ids

    cfg = preset_config("tiny", thinker_ids=tiny_thinker_special_ids(), talker_ids=tiny_talker_special_ids(),
                        vocab=TINY_VOCAB_SIZE).talker.flowmodel
    fast, plain = DiT(cfg, kernels=ON), DiT(cfg)
    holders = [m for m in fast.modules() if isinstance(getattr(m, "kernels", None), Kernels)]
    assert len(holders) >= 3 * cfg.depth and all(m.kernels == ON for m in holders)
    assert all(m.kernels == REFERENCE for m in plain.modules() if isinstance(getattr(m, "kernels", None), Kernels))
    assert select_kernels(fast, REFERENCE) is fast
    assert all(m.kernels == REFERENCE for m in holders)
    assert plain.blocks[0].norm1.kernels == REFERENCE
    with pytest.raises(TypeError):
        select_kernels(fast, "triton")


@pytest.mark.skipif(DEVICE != "cuda", reason="the GELU epilogue path is CUDA only")
def test_dit_feedforward_gelu_epilogue_is_the_tanh_gelu():
    """FeedForward on CUDA runs tanh-GELU as the GEMM epilogue; it equals Linear -> GELU(tanh) (fp32)."""
    from realtime_ming.model.dit import FeedForward

    ff = FeedForward(64, 4, kernels=TRITON).to(DEVICE)
    x = _randn(3, 7, 64, dtype=torch.float32)
    with torch.no_grad():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.testing.assert_close(ff(x), ff.ff(x), atol=1e-5, rtol=1e-5)


def test_attention_any_length_grouped_kv_with_mask_equals_sdpa_gqa():
    """Grouped K/V + mask (thinker prefill) is computed with K/V expanded per query head: same result as
    SDPA's own enable_gqa path."""
    from realtime_ming.model.kernels.sdpa import attention_any_length

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 5, 16, generator=gen)
    k, v = (torch.randn(2, 2, 11, 16, generator=gen) for _ in range(2))
    mask = torch.rand(2, 1, 5, 11, generator=gen) > 0.3
    mask[..., 0] = True  # no all-masked row
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(attention_any_length(q, k, v, attn_mask=mask, enable_gqa=True), want)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,heads,hd", [(37, 4, 64), (5, 2, 16), (20, 3, 32)])
@pytest.mark.parametrize("split", [True, False])
def test_dit_rotary_attention_equals_rotary_sdpa_merge(dtype, t, heads, hd, split, monkeypatch):
    """The DiT's one-kernel attention (interleaved rotary of q/k, softmax attention, heads merged) equals
    head_rotary -> SDPA -> transpose/reshape, for the DiT's 37 tokens, the aggregator's 5 and an odd width,
    with the queries in one block per (row, head) or split into blocks, all queries or only the last few."""
    from realtime_ming.model.dit import InterleavedRotary
    from realtime_ming.model.kernels import dit_attention

    if split:  # several programs per (row, head), each a block of 16 queries (`bench/dit_attention_bench.py` sweeps)
        monkeypatch.setattr(dit_attention, "launch_config", lambda queries: (16, 4))

    qkv = _randn(2, t, 3 * heads * hd, dtype=dtype)
    cos, sin = InterleavedRotary(hd).to(DEVICE)(t)
    assert dit_attention.fits(qkv, heads, cos, kernels=ON)
    got = dit_attention.rotary_attention(qkv, heads, cos, sin, kernels=ON)
    want = dit_attention.rotary_attention_reference(qkv, heads, cos, sin)
    _close(got, want)
    # only the last few queries (the DiT's last block needs its patch positions only): the same rows
    for n in (1, 4):
        _close(dit_attention.rotary_attention_reference(qkv, heads, cos, sin, queries=n), want[:, -n:])
        _close(dit_attention.rotary_attention(qkv, heads, cos, sin, kernels=ON, queries=n), want[:, -n:])
    with pytest.raises(ValueError, match="queries"):
        dit_attention.rotary_attention(qkv, heads, cos, sin, kernels=ON, queries=t + 1)
    # out of the kernel's range: the reference path, same result
    assert not dit_attention.fits(qkv[:, :1].expand(2, 200, -1), heads, cos, kernels=ON)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cfm_step_equals_guided_euler_plus_noise(dtype):
    """One kernel for v = v_c + (v_c - v_u)·cfg, y + v·dt, + noise·sqrt(|dt|)·rnd equals the reference ops,
    per-row cfg / noise scale and one shared."""
    from realtime_ming.model.kernels.cfm_step import cfm_step, cfm_step_reference

    y, rnd = _randn(3, 4, 64, dtype=dtype), _randn(3, 4, 64, dtype=dtype, seed=1)
    both = _randn(6, 4, 64, dtype=dtype, seed=2)
    dt = torch.tensor(0.0390625, device=DEVICE, dtype=dtype)
    for cfg, scale in ((torch.tensor([2.0, 1.5, 0.0]), torch.tensor([0.25, 0.0, 0.5])),
                       (torch.tensor([2.0]), torch.tensor([0.0]))):
        cfg, scale = cfg.to(DEVICE, dtype).reshape(-1, 1, 1), scale.to(DEVICE, dtype).reshape(-1, 1, 1)
        got = cfm_step(y, both, dt, cfg, scale, rnd, kernels=ON)
        want = cfm_step_reference(y, both, dt, cfg, scale, rnd)
        if dtype == torch.float32:
            _close(got, want)
        else:  # one rounding in the kernel, five in the reference chain
            torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=2 ** -6)
