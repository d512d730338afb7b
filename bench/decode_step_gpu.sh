#!/usr/bin/env bash
# One H200 (nvidia-h200), ONE device call of <= 6 min: the decode step's kernels outside the experts (issue 45).
#   tests    tests/test_step_plan_kernels.py (every tier: the dense GEMV against F.linear's math, the plan's
#            choice, the rotary split and router shapes = the shipped ones, a tiny thinker step with every knob on),
#            tests/test_fp8_kernels.py (incl. the down GEMV with a token's experts in one tile), tests/test_gpu_fp8.py
#            (graphed FP8 decoder = eager, also with every knob on; graphed engine = eager), compiled       ~1.5 min
#   kernels  bench/decode_step_bench.py: at the real shapes the dense projections (QKV, O, layer 0's MLP, the LM
#            head) per row count 1/2/4/8, cuBLAS vs the GEMV's tiles; the rotary's heads a program; the router's
#            shapes; one MoE layer's FP8 GEMVs with the down GEMV reading a token's experts in one tile; writes
#            OUT/kernels/step_plan{,_gemv,_launch}.json and OUT/kernels/fp8_plan.json (what they pick)       ~2 min
#   step     bench/fp8_step_ab.py: the whole thinker (TP=1, FP8 experts, dummy weights) built once, graphed decode
#            at bs=1/16/64 for: the shipped plans; + the picked step plan; + its GEMV tiles only; the picked FP8
#            plan (down tiles) alone; both picked plans. bs=1 of each under torch.profiler                 ~2.5 min
#   bash bench/decode_step_gpu.sh OUT_DIR           (after `source bench/gpu_setup.sh`; device tool: carry [".whl"])
#   DRY_RUN=1 bash bench/decode_step_gpu.sh OUT_DIR (no GPU: Triton's interpreter, tiny shapes, eager: plumbing only)
# Env: STEPS (default "tests kernels step"), ROWS (the kernels' row counts), BATCHES (the step's buckets), PLANS (the
# step's plans, default shipped + the four picked combinations), PROFILE (profiled buckets, default 1). Writes OUT_DIR/summary.md
# and prints it at the end.
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
  kern_args=(--dry-run --rows "${ROWS:-1,3}")
  step_args=(--dry-run --batches "${BATCHES:-1,2}" --steps 2 --reps 1)
  test_sel=(-m "not slow" -k "plan or linear or one_tile")
  echo "# decode step kernels, DRY RUN on CPU ($(git rev-parse --short HEAD 2>/dev/null)): plumbing only, no timing" >> "$summary"
else
  kern_args=(--rows "${ROWS:-1,2,4,8}")
  step_args=(--batches "${BATCHES:-1,16,64}")
  test_sel=(-m "")
  nvidia-smi > "$out/nvidia_smi.txt" 2>&1 || true
  echo "# decode step kernels on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) ($(git rev-parse --short HEAD 2>/dev/null))" >> "$summary"
fi
t0=$SECONDS
if [[ $steps == *" tests "* ]]; then
  timeout -s ABRT "${TEST_TIMEOUT_S:-120}" python3 -X faulthandler -m pytest -q -rA -p no:cacheprovider -o addopts="" \
    "${test_sel[@]}" tests/test_step_plan_kernels.py tests/test_fp8_kernels.py tests/test_gpu_fp8.py > "$out/tests.log" 2>&1
  echo "tests rc=$? ($((SECONDS - t0)) s)"; tail -3 "$out/tests.log"
  { echo "## tests (tests/test_step_plan_kernels.py tests/test_fp8_kernels.py tests/test_gpu_fp8.py)"; tail -1 "$out/tests.log";
    grep -E "^(FAILED|ERROR)" "$out/tests.log"; } >> "$summary"
fi
if [[ $steps == *" kernels "* ]]; then
  timeout "${KERNELS_TIMEOUT_S:-120}" python3 -m bench.decode_step_bench --out "$out/kernels" "${kern_args[@]}" \
    > "$out/kernels.log" 2>&1
  echo "decode_step_bench rc=$? ($((SECONDS - t0)) s)"; tail -3 "$out/kernels.log"
  { echo "## kernels outside the experts: cuBLAS vs the GEMV, rotary, router (µs graphed)";
    cat "$out/kernels/decode_step_bench.md" 2>/dev/null || tail -8 "$out/kernels.log"; } >> "$summary"
fi
if [[ $steps == *" step "* ]]; then
  plans=${PLANS:-shipped}
  k=$out/kernels
  if [[ -z ${PLANS:-} && -f $k/step_plan.json ]]; then
    [[ -f $k/fp8_plan.json ]] && plans="$plans,$k/fp8_plan.json+step=$k/step_plan.json"
    plans="$plans,shipped+step=$k/step_plan.json"
    [[ -f $k/fp8_plan.json ]] && plans="$plans,$k/fp8_plan.json"
    plans="$plans,shipped+step=$k/step_plan_gemv.json"
  fi
  timeout "${STEP_TIMEOUT_S:-150}" python3 -m bench.fp8_step_ab --out "$out/step" --plans "$plans" "${step_args[@]}" \
    --profile "${PROFILE:-1}" > "$out/step.log" 2>&1
  echo "fp8_step_ab rc=$? ($((SECONDS - t0)) s)"; tail -3 "$out/step.log"
  { echo "## whole thinker, one GPU, FP8 experts: graphed decode step per plan (tp_bench.py's method)";
    cat "$out/step/fp8_step_ab.md" 2>/dev/null || grep -E "ms a step|Error|error" "$out/step.log" | tail -20; } >> "$summary"
fi
echo "total $((SECONDS - t0)) s" >> "$summary"
echo "===== $summary"
cat "$summary"
