#!/usr/bin/env bash
# One H200 (nvidia-h200), ONE device call of ~4-5 min (<= 6.7 min with every step at its time limit): the decode
# step's kernels outside the experts, and the FP8 down GEMV (issue 45).
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
source "$(dirname "$0")/gpu_kit.sh"
kit_begin "${1:?out dir}"
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
if [[ $steps == *" tests "* ]]; then
  kit_tests "${TEST_TIMEOUT_S:-100}" "${test_sel[@]}" tests/test_step_plan_kernels.py tests/test_fp8_kernels.py \
    tests/test_gpu_fp8.py
fi
if [[ $steps == *" kernels "* ]]; then
  kit_step decode_step_bench "$out/kernels.log" "${KERNELS_TIMEOUT_S:-150}" \
    "kernels outside the experts: cuBLAS vs the GEMV, rotary, router, the FP8 down GEMV (µs graphed)" \
    "$out/kernels/decode_step_bench.md" python3 -m bench.decode_step_bench --out "$out/kernels" "${kern_args[@]}"
fi
if [[ $steps == *" step "* ]]; then
  plans=${PLANS:-shipped}
  k=$out/kernels
  if [[ -z ${PLANS:-} && -f $k/step_plan.json ]]; then  # the most telling first: a run cut short keeps them
    [[ -f $k/fp8_plan.json ]] && plans="$plans,$k/fp8_plan.json+step=$k/step_plan.json"
    plans="$plans,shipped+step=$k/step_plan.json"
    [[ -f $k/fp8_plan.json ]] && plans="$plans,$k/fp8_plan.json"
    plans="$plans,shipped+step=$k/step_plan_gemv.json"
  fi
  kit_step_ab "$plans" "${STEP_TIMEOUT_S:-150}"
fi
echo "total $((SECONDS - t0)) s" >> "$summary"
echo "===== $summary"
cat "$summary"
