#!/usr/bin/env bash
# One H200 (nvidia-h200): the FP8 experts (engine.expert_dtype: fp8, issue 45) checked and measured in one call:
#   tests    the FP8 kernel tests compiled on the GPU (tests/test_fp8_kernels.py), the graphed FP8 decoder and engine
#            against eager (tests/test_gpu_fp8.py), the quantisation / loading / fidelity tests (tests/test_fp8.py);
#   kernels  bench/fp8_kernel_bench.py: FP8 vs bf16 expert kernels at the real shapes (TP=1 rank), decode N=1/16 and
#            the grouped path at N=64 (decode above 16 rows) / 512 (mixed step) / 2048 (prefill chunk), time and
#            per-layer output error against fp32, the whole MoE block's error and the next router's choices kept;
#   fidelity bench/fp8_fidelity.py --device cuda: FP8 vs fp32 on the golden cases, 512 greedy tokens each;
#   decode   bench/tp_bench.py --tp 1 --expert-dtype fp8: the whole thinker (dummy weights) on one GPU, decode tok/s
#            per stream at bs=1/16/64, eager and CUDA-graphed;
#   served   bench/gpu_e2e.sh with configs/ming-flash-omni-2.0-1gpu.yaml (the one-GPU config's start-up check):
#            TTFA at c=1 and c=16, GPU memory after load.
#   bash bench/fp8_gpu.sh OUT_DIR          (after `source bench/gpu_setup.sh`; device tool: carry [".whl", ".turns"])
# Env: STEPS (default "tests kernels fidelity decode served"; ~10 min in all: two calls of
# STEPS="tests kernels fidelity" and STEPS="decode served" leave room). Writes OUT_DIR/summary.md.
set -uo pipefail
out=${1:?out dir}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
steps=" ${STEPS:-tests kernels fidelity decode served} "
nvidia-smi > "$out/nvidia_smi.txt" 2>&1 || true
summary="$out/summary.md"
echo "# FP8 experts on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) ($(git rev-parse --short HEAD 2>/dev/null))" >> "$summary"
if [[ $steps == *" tests "* ]]; then
  timeout -s ABRT "${TEST_TIMEOUT_S:-240}" python3 -X faulthandler -m pytest -q -rA -p no:cacheprovider -o addopts="" \
    tests/test_fp8_kernels.py tests/test_gpu_fp8.py tests/test_fp8.py > "$out/tests.log" 2>&1
  echo "tests rc=$?"; tail -4 "$out/tests.log"
  { echo "## tests"; tail -1 "$out/tests.log"; grep -E "^(FAILED|ERROR)" "$out/tests.log"; } >> "$summary"
fi
if [[ $steps == *" kernels "* ]]; then
  timeout 180 python3 -m bench.fp8_kernel_bench --out "$out/kernels" --tokens "${TOKENS:-1,16,64,512,2048}" \
    > "$out/kernels.log" 2>&1
  echo "fp8_kernel_bench rc=$?"; cat "$out/kernels/fp8_kernel_bench.md" 2>/dev/null || tail -20 "$out/kernels.log"
  { echo "## kernels (one MoE layer, real shapes, TP=1)"; cat "$out/kernels/fp8_kernel_bench.md" 2>/dev/null; } >> "$summary"
fi
if [[ $steps == *" fidelity "* ]]; then
  timeout 120 python3 -m bench.fp8_fidelity --device cuda --tokens 512 --out "$out/fidelity.json" > "$out/fidelity.log" 2>&1
  echo "fp8_fidelity rc=$?"; cat "$out/fidelity.log" | tail -8
  { echo "## fidelity (golden cases, 512 greedy tokens, CUDA kernels)"; grep -E "^\|" "$out/fidelity.log"; } >> "$summary"
fi
if [[ $steps == *" decode "* ]]; then
  timeout 240 python3 bench/tp_bench.py --tp 1 --expert-dtype fp8 --batches 1,16,64 --budget-s 150 \
    --out "$out/decode" > "$out/decode.log" 2>&1
  echo "tp_bench fp8 rc=$?"; grep -E "^\|" "$out/decode/tp_bench.md" 2>/dev/null | head -20
  { echo "## thinker decode, whole model on one GPU (FP8 experts, dummy weights)"; grep -E "^\|" "$out/decode/tp_bench.md" 2>/dev/null; } >> "$summary"
fi
if [[ $steps == *" served "* ]]; then
  TURNS=${TURNS:-2} timeout 330 bash bench/gpu_e2e.sh "$out/e2e" 1,16 configs/ming-flash-omni-2.0-1gpu.yaml > "$out/e2e.log" 2>&1
  echo "served rc=$?"; grep -E "server up|TTFA|^\|" "$out/e2e.log" | head -20; cat "$out/e2e/gpus.csv" 2>/dev/null
  { echo "## served, configs/ming-flash-omni-2.0-1gpu.yaml (dummy weights)"; grep -E "server up" "$out/e2e.log";
    cat "$out/e2e/gpus.csv" 2>/dev/null; cat "$out/e2e/bench/summary.md" 2>/dev/null | head -30; } >> "$summary"
fi
echo "summary: $summary"
