"""model.kernels.pdl: the decode step's Triton kernels with programmatic dependent launch (the step plan's `pdl`).

Each kernel family runs as a chain, every launch reading what the one before wrote (so on a Hopper GPU the next
kernel is in flight while the one before finishes), with `pdl` on and off: the same bits. On a GPU of compute
capability >= 9 the launches really are PDL (asserted); elsewhere (older GPUs, Triton's CPU interpreter) the knob
must change nothing, which the same chains check. The compiled kernels' PTX for sm_90 (built without a GPU):
none of the grid dependency controls with PDL off; with it one release, one wait, the weights' first chunk read
above the wait. The graphed decode step with PDL: tests/test_gpu_pdl.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernel_support import seeded_randn, DEVICE, NEEDS_TRITON, ON

from realtime_ming.model import fp8
from realtime_ming.model.kernels import dense_gemv, moe_fp8, norm, pdl, step_plan
from realtime_ming.model.kernels import moe_decode as md
from realtime_ming.model.kernels.rotary import RotaryStyle, head_rotary
from realtime_ming.model.kernels.slot_attention import decode_attention
from realtime_ming.model.kernels.step_plan import StepPlan

pytestmark = NEEDS_TRITON

ROOT = Path(__file__).resolve().parent.parent
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
BIG = DEVICE == "cuda"  # the interpreter runs every program in Python: small shapes there
PLAN = StepPlan(rotary_heads=2, router_splits=4, router_block_e=16, select_warps=1)


def _both(monkeypatch, chain) -> None:
    """chain() with the plan's PDL off and on: every tensor it returns the same bits; on Hopper PDL really on."""
    out = []
    for on in (False, True):
        monkeypatch.setattr(step_plan, "STEP_PLAN", dataclasses.replace(PLAN, pdl=on))
        probe = torch.empty(1, device=DEVICE)
        assert pdl.launch(probe) == ({"PDL": True, "launch_pdl": True} if on and HOPPER else {"PDL": False})
        out.append([t.clone() for t in chain()])
        if DEVICE == "cuda":
            torch.cuda.synchronize()
    assert len(out[0]) == len(out[1])
    for i, (a, b) in enumerate(zip(*out)):
        assert torch.equal(a, b), f"output {i} differs with PDL"


def test_pdl_only_where_the_plan_and_the_device_allow_it(monkeypatch):
    cpu = torch.empty(1)
    monkeypatch.setattr(step_plan, "STEP_PLAN", StepPlan(pdl=True))
    assert pdl.launch(cpu) == {"PDL": False} and not pdl.supported(cpu.device)
    monkeypatch.setattr(step_plan, "STEP_PLAN", StepPlan())
    assert pdl.launch(cpu) == {"PDL": False}
    if torch.cuda.is_available():
        assert pdl.supported(torch.device("cuda")) == HOPPER


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("tile", [{"n": 4, "k": 128, "warps": 2, "stages": 3},
                                  {"n": 16, "k": 64, "warps": 4, "stages": 2, "dot": True}], ids=["regs", "dot"])
def test_gemv_chain_same_bits(monkeypatch, rows, tile):
    """y <- y W^T twelve times (K = N, K not a multiple of the chunk): each launch reads the one before's output."""
    k = 1000 if BIG else 72
    w = seeded_randn(k, k, dtype=torch.bfloat16, seed=1, scale=k ** -0.5)
    x = seeded_randn(rows, k, dtype=torch.bfloat16)

    def chain():
        ys = [x]
        for _ in range(12 if BIG else 3):
            ys.append(dense_gemv.gemv(ys[-1], w, tile))
        return ys[1:]

    _both(monkeypatch, chain)


def test_norm_chain_same_bits(monkeypatch):
    """(h, s) <- add_rms_norm(s, h): each launch reads both outputs of the one before."""
    d = 4096 if BIG else 64
    w = 1 + 0.1 * seeded_randn(d, dtype=torch.bfloat16, seed=2)
    s0, h0 = seeded_randn(3, d, dtype=torch.bfloat16), seeded_randn(3, d, dtype=torch.bfloat16, seed=1)

    def chain():
        out, s, h = [], s0, h0
        for _ in range(12 if BIG else 3):
            h, s = norm.add_rms_norm(s, h, w, 1e-6, kernels=ON)
            out += [h, s]
        return out

    _both(monkeypatch, chain)


@pytest.mark.parametrize("tokens,live,together", [(1, False, True), (3, True, True), (2, False, False)],
                         ids=["1-row", "3-rows-padding", "2-rows-down-per-expert"])
def test_router_and_fp8_experts_chain_same_bits(monkeypatch, tokens, live, together):
    """x <- experts(x, route(x)) (router logits, selection, FP8 gate|up, down): the expert ids each launch reads
    are the output of the launch before."""
    e, d, inter, top_k, groups = (64, 1024, 256, 8, 8) if BIG else (16, 64, 32, 4, 4)
    q_gu, s_gu = fp8.quantize(seeded_randn(e, 2 * inter, d, seed=1, scale=d ** -0.5))
    q_d, s_d = fp8.quantize(seeded_randn(e, d, inter, seed=2, scale=inter ** -0.5))
    sg, su = (seeded_randn(inter, d, dtype=torch.bfloat16, seed=s, scale=d ** -0.5) for s in (3, 4))
    sd = seeded_randn(d, inter, dtype=torch.bfloat16, seed=5, scale=inter ** -0.5)
    router = seeded_randn(e, d, dtype=torch.bfloat16, seed=6, scale=d ** -0.5)
    bias = seeded_randn(e, seed=7, scale=0.05)
    mask = torch.tensor([True, False, True][:tokens], device=DEVICE) if live else None
    tune = {"gu_n": 4, "gu_k": 128 if BIG else 32, "gu_warps": 2, "gu_stages": 3, "dn_d": 4,
            "dn_k": 128 if BIG else 16, "dn_warps": 2, "dn_stages": 3, "dn_all": int(together)}
    x0 = seeded_randn(tokens, d, dtype=torch.bfloat16, seed=8)

    def chain():
        out, x = [], x0
        for _ in range(6 if BIG else 1):
            ids, wts = md.route(x, router, bias, top_k, groups, groups // 2, 2.5, kernels=ON)
            x = moe_fp8.moe_decode(x, ids, wts, q_gu, q_d, sg, su, sd, s_gu, s_d, kernels=ON, tune=tune, live=mask)
            out += [ids, wts, x]
        return out

    _both(monkeypatch, chain)


def test_rotary_attention_chain_same_bits(monkeypatch):
    """Per position: the rotary writes K/V into the slot cache, the attention reads up to it, a GEMV turns its
    output into the next position's QKV (thinker layout: q/k norm, partial rotary)."""
    b, h, kv, hd, rd, steps = (3, 8, 2, 128, 64, 12) if BIG else (3, 2, 1, 32, 16, 2)
    width = (h + 2 * kv) * hd
    qn, kn = (1 + 0.1 * seeded_randn(hd, dtype=torch.bfloat16, seed=s) for s in (3, 4))
    ang = seeded_randn(b, steps, rd, seed=5)
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    w = seeded_randn(width, h * hd, dtype=torch.bfloat16, seed=6, scale=(h * hd) ** -0.5)
    slots = torch.tensor([2, 0, 3], device=DEVICE)
    tile = {"n": 8, "k": 128 if BIG else 32, "warps": 2, "stages": 3}

    def chain():
        ck, cv = (torch.zeros(4, kv, steps, hd, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
        qkv, out = seeded_randn(b, 1, width, dtype=torch.bfloat16), []
        for t in range(steps):
            index = torch.full((b, 1), t, device=DEVICE)
            q, _, _ = head_rotary(qkv, h, kv, hd, cos[:, t:t + 1], sin[:, t:t + 1], RotaryStyle.NEOX_ROUND_EACH,
                                  q_norm=qn, k_norm=kn, eps=1e-6, k_out=ck, v_out=cv, rows=slots, index=index,
                                  kernels=ON)
            o = decode_attention(q, ck, cv, slots, torch.full((b,), t + 1, device=DEVICE), kernels=ON)
            qkv = dense_gemv.gemv(o.reshape(b, 1, h * hd), w, tile)
            out += [q, o, qkv]
        return out + [ck, cv]

    _both(monkeypatch, chain)


@pytest.mark.slow
def test_compiled_kernels_wait_before_reading_what_the_kernel_before_wrote():
    """PTX for sm_90 (Triton compiled, no GPU needed): PDL off has no grid dependency control at all; PDL on has one
    launch_dependents before one wait, and the weight-streaming kernels read their first weight chunk above it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_DEFAULT_FP_FUSION=env.get("TRITON_DEFAULT_FP_FUSION", "1"))
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "pdl_ptx_support.py")], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    kernels = json.loads(run.stdout)
    assert set(kernels) == {"gemv", "gemv_dot", "fp8_gate_up", "fp8_down_all", "router_logits", "rms_norm"}
    for name, v in kernels.items():
        assert v["off"]["launch_dependents"] == v["off"]["wait"] == 0, name
        on = v["on"]
        assert on["launch_dependents"] == on["wait"] == 1 and 0 <= on["first_release"] < on["first_wait"], name
        assert (on["loads_before_wait"] > 0) == (name != "rms_norm"), (name, on)
