#!/usr/bin/env bash
# One H200 (nvidia-h200), ONE device call of ~6 min (<= 7.7 min with every step at its time limit): programmatic
# dependent launch of the decode step's Triton kernels (issue 45; model/kernels/pdl.py, the step plan's `pdl`).
#   tests  compiled, every tier: tests/test_pdl_kernels.py (each kernel family in a chain, PDL on = off bit for bit,
#          PDL really on; the kernels' sm_90 PTX), tests/test_gpu_pdl.py (the FP8 thinker's step graphed with PDL =
#          without it, = eager), and with PDL off the kernels' own tests: tests/test_step_plan_kernels.py,
#          tests/test_fp8_kernels.py, tests/test_gpu_fp8.py                                            ~2.5 min
#   probe  bench/pdl_probe.py: chains of 200 norm / GEMV launches captured in a CUDA graph, PDL off vs on: us a
#          kernel, same bits, programmatic edges in the graph's DOT dump (does PDL survive capture here)  ~0.3 min
#   step   bench/fp8_step_ab.py: the whole thinker (TP=1, FP8 experts, dummy weights) built once, graphed decode at
#          bs=1/16/64 for `shipped+nopdl`, `shipped` (PDL on) and, with PDL, the shipped plan with the QKV projection through the
#          GEMV too (OUT_DIR/step_plan_qkv_gemv.json: cuBLAS's QKV is the one launch a layer PDL does not connect), in
#          turn ROUNDS times (each batch's median), bs=1 of each under torch.profiler (wall, GPU busy, idle between
#          kernels; with PDL a kernel's time includes its wait)                                          ~4 min
#   bash bench/pdl_gpu.sh OUT_DIR           (after `source bench/gpu_setup.sh`; device tool: carry [".whl"])
#   DRY_RUN=1 bash bench/pdl_gpu.sh OUT_DIR (no GPU: Triton's interpreter, tiny shapes, eager: plumbing only)
# Env: STEPS (default "tests probe step"), BATCHES (default 1,16,64), ROUNDS (default 3), PLANS (default the three
# above), PROFILE (profiled buckets, default 1). Writes OUT_DIR/summary.md; prints it, then the key numbers.
set -uo pipefail
source "$(dirname "$0")/gpu_kit.sh"
STEPS=${STEPS:-tests probe step}
kit_begin "${1:?out dir}"
tests=(tests/test_pdl_kernels.py tests/test_gpu_pdl.py)
if [[ $dry == 1 ]]; then
  export TRITON_INTERPRET=1
  step_args=(--dry-run --batches "${BATCHES:-1,2}" --steps 2 --reps 1 --rounds "${ROUNDS:-2}")
  test_sel=(-m "not slow")
  echo "# PDL of the decode step, DRY RUN on CPU ($(git rev-parse --short HEAD 2>/dev/null)): plumbing" >> "$summary"
else
  step_args=(--batches "${BATCHES:-1,16,64}" --rounds "${ROUNDS:-3}")
  test_sel=(-m "")
  tests+=(tests/test_step_plan_kernels.py tests/test_fp8_kernels.py tests/test_gpu_fp8.py)
  nvidia-smi > "$out/nvidia_smi.txt" 2>&1 || true
  versions=$(python3 -c 'import torch, triton as t; print("torch", torch.__version__, torch.version.cuda, "triton", t.__version__)')
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "# PDL of the decode step on $gpu ($(git rev-parse --short HEAD 2>/dev/null)), $versions" >> "$summary"
fi
if [[ $steps == *" tests "* ]]; then
  kit_tests "${TEST_TIMEOUT_S:-150}" "${test_sel[@]}" "${tests[@]}"
fi
if [[ $steps == *" probe "* && $dry != 1 ]]; then  # CUDA only
  kit_step pdl_probe "$out/probe.log" "${PROBE_TIMEOUT_S:-40}" \
    "PDL probe: kernel chains in one CUDA graph, PDL off -> on" "$out/probe.log" \
    python3 -m bench.pdl_probe --out "$out/probe"
fi
if [[ $steps == *" step "* ]]; then
  qkv=$out/step_plan_qkv_gemv.json
  python3 - "$qkv" <<'PY'
import json, sys
from realtime_ming.model.kernels import step_plan
plan = step_plan.to_json(step_plan.STEP_PLAN)
for _, tiles in plan["gemv"]:  # QKV (5120 x 4096 at TP=1) with the O projection's tile, where that one has a tile
    tiles["5120x4096"] = tiles.get("4096x4096")
open(sys.argv[1], "w").write(json.dumps(plan))
PY
  kit_step_ab "${PLANS:-shipped+nopdl,shipped,shipped+step=$qkv}" "${STEP_TIMEOUT_S:-270}"
fi
echo "total $((SECONDS - t0)) s" >> "$summary"
echo "===== $summary"
cat "$summary"
echo "===== key numbers"
grep -h "^pdl probe" "$out/probe.log" 2>/dev/null
grep -h "^key: " "$out/step.log" 2>/dev/null
grep -h -E "passed|failed" "$out/tests.log" 2>/dev/null | tail -1
