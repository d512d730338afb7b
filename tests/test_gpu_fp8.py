"""The FP8-expert thinker on CUDA (compiled kernels): the graphed decoder equals the eager one, and the graphed FP8
engine generates the eager FP8 engine's tokens (CUDA only; the kernels against their references:
tests/test_fp8_kernels.py, which runs compiled here too)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gpu_engine_support import generate

from realtime_ming.engine.thinker_decode import ThinkerDecoder
from realtime_ming.model.kernels import TRITON, moe_fp8, step_plan
from realtime_ming.model.kernels.step_plan import StepPlan
from realtime_ming.model.thinker import ThinkerKVCache, load_thinker

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
pytestmark = [cuda, pytest.mark.timeout(300)]


# every knob of the step plan on: the dense GEMV (register tiles to 2 rows, the tensor-core dot to 8), the rotary's
# heads over programs, other router shapes (bench/decode_step_bench.py measures which of them pay)
EVERY_KNOB = StepPlan(gemv=((2, {"*": {"n": 4, "k": 512, "warps": 2, "stages": 3}}),
                            (8, {"*": {"n": 32, "k": 128, "warps": 4, "stages": 3, "dot": True}})),
                      rotary_heads=4, router_splits=8, router_block_e=16, select_warps=1)


@pytest.mark.parametrize("dtype,plan", [(torch.float32, None), (torch.bfloat16, None),
                                        (torch.bfloat16, EVERY_KNOB)], ids=["fp32", "bf16", "bf16-every-knob"])
def test_fp8_graphed_decoder_equals_eager(fixture_root, dtype, plan, monkeypatch):
    """Every batch 1..5 (buckets 1, 2, 4, 8): the CUDA-graphed FP8 decode step's logits equal the eager step's
    (also with every knob of the step plan on)."""
    if plan is not None:
        monkeypatch.setattr(step_plan, "STEP_PLAN", plan)
    thinker = load_thinker(fixture_root, device="cuda", dtype=dtype, kernels=TRITON, expert_dtype="fp8")
    caches = [ThinkerKVCache.allocate(thinker.cfg, 8, 512, device="cuda", dtype=dtype) for _ in range(2)]
    for c in caches:
        c.k.normal_(generator=torch.Generator("cuda").manual_seed(0))
        c.v.normal_(generator=torch.Generator("cuda").manual_seed(1))
    graphed = ThinkerDecoder(thinker, caches[0], (1, 2, 4, 8), (512,), device="cuda")
    eager = ThinkerDecoder(thinker, caches[1], (1, 2, 4, 8), (512,), device="cuda", enforce_eager=True)
    graphed.capture()
    assert graphed.graphed and not eager.graphed
    rng = np.random.default_rng(0)
    for batch in range(1, 6):
        slots = [int(s) for s in rng.permutation(8)[:batch]]
        args = ([int(t) for t in rng.integers(0, 500, batch)], [int(p) for p in rng.integers(340, 400, batch)],
                [0] * batch, slots)
        torch.testing.assert_close(graphed.step(*args).clone(), eager.step(*args), rtol=1e-4, atol=1e-4)


def test_fp8_graphed_decoder_equals_eager_on_the_tensor_core_path(fixture_root):
    """Batches 9..16 in the 16-row bucket, which the decode plan sends to the FP8 tensor-core experts (a8): the
    graphed step's logits equal the eager step's."""
    thinker = load_thinker(fixture_root, device="cuda", dtype=torch.bfloat16, kernels=TRITON, expert_dtype="fp8")
    assert moe_fp8.decode_plan().path(16) == "grouped"
    caches = [ThinkerKVCache.allocate(thinker.cfg, 16, 512, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    for c in caches:
        c.k.normal_(generator=torch.Generator("cuda").manual_seed(0))
        c.v.normal_(generator=torch.Generator("cuda").manual_seed(1))
    graphed = ThinkerDecoder(thinker, caches[0], (16,), (512,), device="cuda")
    eager = ThinkerDecoder(thinker, caches[1], (16,), (512,), device="cuda", enforce_eager=True)
    graphed.capture()
    rng = np.random.default_rng(1)
    for batch in (9, 16):
        slots = [int(s) for s in rng.permutation(16)[:batch]]
        args = ([int(t) for t in rng.integers(0, 500, batch)], [int(p) for p in rng.integers(340, 400, batch)],
                [0] * batch, slots)
        want = eager.step(*args).clone()
        torch.testing.assert_close(graphed.step(*args).clone(), want, rtol=1e-4, atol=1e-4)


def test_fp8_graphed_engine_generates_the_eager_engines_tokens(fixture_root):
    """A text and an audio turn through the whole engine with fp8 experts: graphs on == graphs off, token for token
    (prefill through the FP8 tensor-core kernels, decode through the FP8 GEMVs)."""
    eager = generate(fixture_root, eager=True, expert_dtype="fp8")
    graphed = generate(fixture_root, eager=False, expert_dtype="fp8")
    assert [d.output_tokens for d in graphed] == [d.output_tokens for d in eager] == [24, 24]
    assert [d.text for d in graphed] == [d.text for d in eager]
