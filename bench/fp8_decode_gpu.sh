#!/usr/bin/env bash
# One H200 (nvidia-h200), ONE device call of <= 9 min: the FP8 decode plan (issue 45) checked and measured.
#   tests    tests/test_fp8_kernels.py + tests/test_gpu_fp8.py compiled on the GPU, every tier (kernels against
#            their references, the one-launch a8 quantisation bit for bit, graphed FP8 decoder = eager incl. the
#            16-row bucket on the tensor-core path, graphed FP8 engine = eager)                          ~1.5 min
#   kernels  bench/fp8_decode_bench.py --tune: one MoE layer (TP=1, real shapes) per row count 1,2,4,8,16,64,
#            every expert path (GEMVs shipped / swept tiles, a8 with PyTorch / one-launch quantisation and narrow
#            tiles, w8a16, bf16), time + error vs fp32; writes OUT/kernels/fp8_plan.json (the plan they pick)  ~2 min
#   step     bench/fp8_step_ab.py: the whole thinker (TP=1, FP8 experts, dummy weights) built once, graphed decode
#            at bs=1/16/64 for the plans base (before: GEMVs up to 16 rows), shipped, and the picked one; bs=1 of
#            each under torch.profiler (kernels, launches, GPU idle: where the step's time goes)       ~2.5 min
#   bash bench/fp8_decode_gpu.sh OUT_DIR           (after `source bench/gpu_setup.sh`; device tool: carry [".whl"])
#   DRY_RUN=1 bash bench/fp8_decode_gpu.sh OUT_DIR (no GPU: Triton's interpreter, tiny shapes, eager: plumbing only)
# Env: STEPS (default "tests kernels step"), TOKENS (kernels' row counts), BATCHES (step's buckets), PLANS (step's
# plans, default "base,shipped" + the picked plan when the kernels step wrote one), PROFILE (the step's profiled
# buckets, default 1). Writes OUT_DIR/summary.md and prints it (the compact table) at the end.
set -uo pipefail
source "$(dirname "$0")/gpu_kit.sh"
kit_begin "${1:?out dir}"
if [[ $dry == 1 ]]; then
  export TRITON_INTERPRET=1
  kern_args=(--dry-run --tokens "${TOKENS:-1,17}" --tune)
  step_args=(--dry-run --batches "${BATCHES:-1,2}" --steps 2 --reps 1)
  test_sel=(-m "not slow" -k "plan or quantize or either")
  echo "# FP8 decode plan, DRY RUN on CPU ($(git rev-parse --short HEAD 2>/dev/null)): plumbing only, no timing" >> "$summary"
else
  kern_args=(--tokens "${TOKENS:-1,2,4,8,16,64}" --tune)
  step_args=(--batches "${BATCHES:-1,16,64}")
  test_sel=()
  nvidia-smi > "$out/nvidia_smi.txt" 2>&1 || true
  echo "# FP8 decode plan on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) ($(git rev-parse --short HEAD 2>/dev/null))" >> "$summary"
fi
if [[ $steps == *" tests "* ]]; then
  kit_tests "${TEST_TIMEOUT_S:-120}" "${test_sel[@]}" tests/test_fp8_kernels.py tests/test_gpu_fp8.py
fi
if [[ $steps == *" kernels "* ]]; then
  kit_step fp8_decode_bench "$out/kernels.log" "${KERNELS_TIMEOUT_S:-180}" \
    "one MoE layer per decode row count (routed + shared experts, us graphed (rel err vs fp32))" \
    "$out/kernels/fp8_decode_bench.md" python3 -m bench.fp8_decode_bench --out "$out/kernels" "${kern_args[@]}"
fi
if [[ $steps == *" step "* ]]; then
  plans=${PLANS:-base,shipped}
  if [[ -z ${PLANS:-} && -f $out/kernels/fp8_plan.json ]]; then plans="$plans,$out/kernels/fp8_plan.json"; fi
  kit_step_ab "$plans" "${STEP_TIMEOUT_S:-220}"
fi
echo "total $((SECONDS - t0)) s" >> "$summary"
echo "===== $summary"
cat "$summary"
