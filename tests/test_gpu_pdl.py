"""The FP8-expert thinker's decode step with programmatic dependent launch (the step plan's `pdl`) on an H200-class
GPU (compute capability >= 9; CUDA only): captured into CUDA graphs the PDL launches give the same logits as the
step without PDL, graphed or eager, bit for bit, and the graphed step equals the eager one (tests/test_gpu_fp8.py's
pattern). The kernels one by one, in chains: tests/test_pdl_kernels.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from realtime_ming.engine.thinker_decode import ThinkerDecoder
from realtime_ming.model.kernels import TRITON, pdl, step_plan
from realtime_ming.model.kernels.step_plan import StepPlan
from realtime_ming.model.thinker import ThinkerKVCache, load_thinker

hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                            reason="needs a CUDA GPU of compute capability >= 9 (PDL)")
pytestmark = [hopper, pytest.mark.timeout(300)]

# the GEMV on every projection of the tiny thinker (register tiles to 2 rows, the tensor-core dot to 8), the rotary
# over programs, other router shapes: every kernel pdl.py touches runs in the step
KNOBS = StepPlan(gemv=((2, {"*": {"n": 4, "k": 512, "warps": 2, "stages": 3}}),
                       (8, {"*": {"n": 32, "k": 128, "warps": 4, "stages": 3, "dot": True}})),
                 rotary_heads=4, router_splits=8, router_block_e=16, select_warps=1)


def test_graphed_decoder_with_pdl_equals_the_step_without(fixture_root, monkeypatch):
    """Batches 1..5 (buckets 1, 2, 4, 8): the graphed step captured with PDL = the graphed step captured without it
    and = the eager step without it, bit for bit; = the eager step with PDL within the graph tests' tolerance."""
    thinker = load_thinker(fixture_root, device="cuda", dtype=torch.bfloat16, kernels=TRITON, expert_dtype="fp8")
    caches = [ThinkerKVCache.allocate(thinker.cfg, 8, 512, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    for c in caches:
        c.k.normal_(generator=torch.Generator("cuda").manual_seed(0))
        c.v.normal_(generator=torch.Generator("cuda").manual_seed(1))
    decoders = {}
    for name, cache, on, eager in (("graphed pdl", caches[0], True, False), ("graphed", caches[1], False, False),
                                   ("eager pdl", caches[2], True, True), ("eager", caches[3], False, True)):
        monkeypatch.setattr(step_plan, "STEP_PLAN", dataclasses.replace(KNOBS, pdl=on))
        assert pdl.launch(caches[0].k) == ({"PDL": True, "launch_pdl": True} if on else {"PDL": False})
        decoders[name] = ThinkerDecoder(thinker, cache, (1, 2, 4, 8), (512,), device="cuda", enforce_eager=eager)
        if not eager:
            decoders[name].capture()  # the plan in force now is what the graph keeps
            assert decoders[name].graphed
    rng = np.random.default_rng(0)
    for batch in range(1, 6):
        slots = [int(s) for s in rng.permutation(8)[:batch]]
        args = ([int(t) for t in rng.integers(0, 500, batch)], [int(p) for p in rng.integers(340, 400, batch)],
                [0] * batch, slots)
        out = {}
        for name, dec in decoders.items():  # eager steps launch under the plan in force at the call
            monkeypatch.setattr(step_plan, "STEP_PLAN", dataclasses.replace(KNOBS, pdl="pdl" in name))
            out[name] = dec.step(*args).clone()
        torch.cuda.synchronize()
        assert torch.equal(out["graphed pdl"], out["graphed"]), batch
        assert torch.equal(out["eager pdl"], out["eager"]), batch
        torch.testing.assert_close(out["graphed pdl"], out["eager pdl"], rtol=1e-4, atol=1e-4)
    for a, b in ((caches[0], caches[1]), (caches[2], caches[3])):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
