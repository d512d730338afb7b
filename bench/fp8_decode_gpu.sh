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
out=${1:?out dir}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
steps=" ${STEPS:-tests kernels step} "
dry=${DRY_RUN:-0}
summary="$out/summary.md"
: > "$summary"
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
t0=$SECONDS
if [[ $steps == *" tests "* ]]; then
  timeout -s ABRT "${TEST_TIMEOUT_S:-120}" python3 -X faulthandler -m pytest -q -rA -p no:cacheprovider -o addopts="" \
    "${test_sel[@]}" tests/test_fp8_kernels.py tests/test_gpu_fp8.py > "$out/tests.log" 2>&1
  echo "tests rc=$? ($((SECONDS - t0)) s)"; tail -3 "$out/tests.log"
  { echo "## tests (tests/test_fp8_kernels.py tests/test_gpu_fp8.py)"; tail -1 "$out/tests.log";
    grep -E "^(FAILED|ERROR)" "$out/tests.log"; } >> "$summary"
fi
if [[ $steps == *" kernels "* ]]; then
  timeout "${KERNELS_TIMEOUT_S:-180}" python3 -m bench.fp8_decode_bench --out "$out/kernels" "${kern_args[@]}" \
    > "$out/kernels.log" 2>&1
  echo "fp8_decode_bench rc=$? ($((SECONDS - t0)) s)"; tail -3 "$out/kernels.log"
  { echo "## one MoE layer per decode row count (routed + shared experts, us graphed (rel err vs fp32))";
    cat "$out/kernels/fp8_decode_bench.md" 2>/dev/null || tail -5 "$out/kernels.log"; } >> "$summary"
fi
if [[ $steps == *" step "* ]]; then
  plans=${PLANS:-base,shipped}
  if [[ -z ${PLANS:-} && -f $out/kernels/fp8_plan.json ]]; then plans="$plans,$out/kernels/fp8_plan.json"; fi
  timeout "${STEP_TIMEOUT_S:-220}" python3 -m bench.fp8_step_ab --out "$out/step" --plans "$plans" "${step_args[@]}" \
    --profile "${PROFILE:-1}" > "$out/step.log" 2>&1
  echo "fp8_step_ab rc=$? ($((SECONDS - t0)) s)"; tail -3 "$out/step.log"
  { echo "## whole thinker, one GPU, FP8 experts: graphed decode step per plan (tp_bench.py's method)";
    cat "$out/step/fp8_step_ab.md" 2>/dev/null || grep -E "ms a step|Error|error" "$out/step.log" | tail -20; } >> "$summary"
fi
echo "total $((SECONDS - t0)) s" >> "$summary"
echo "===== $summary"
cat "$summary"
