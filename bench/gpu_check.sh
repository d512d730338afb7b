#!/usr/bin/env bash
# One GPU: the GPU tests, then the component benchmark with the fused kernels on and off (A/B).
#   bash bench/gpu_check.sh OUT_DIR [TP_SHADOW] [THINKER_LAYERS]
# Needs `source bench/gpu_setup.sh` first. Env: TESTS=0 skips the tests, VARIANTS="fused" runs one side,
# STAGES / REPS / BUDGET_S pass through to gpu_bench.py. Writes OUT_DIR/{tests.log,nvidia_smi.txt} and
# OUT_DIR/{fused,reference}/gpu_bench.{json,md}. The thinker is built as one rank of TP=TP_SHADOW
# (default 2, collectives skipped) with THINKER_LAYERS layers (default 32: the whole rank, ~104 GB
# bf16 at TP=2, an H200), so the decode numbers are one rank's compute at full depth.
set -uo pipefail
out=${1:?out dir}; shadow=${2:-2}; layers=${3:-32}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi > "$out/nvidia_smi.txt" 2>&1 || true
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT_S:-300}" python3 -m pytest -q -p no:cacheprovider -o addopts="" \
    tests/test_fused_kernels.py tests/test_thinker_kernels.py tests/test_gpu_graphs.py tests/test_gpu_moe.py \
    tests/test_gpu_talker_runner.py tests/test_gpu_thinker_decode.py > "$out/tests.log" 2>&1
  echo "tests rc=$?"; tail -15 "$out/tests.log"
fi
for variant in ${VARIANTS:-fused reference}; do
  flag=""; [ "$variant" = reference ] && flag="--no-fused"
  python3 bench/gpu_bench.py $flag --out "$out/$variant" --tp-shadow "$shadow" --thinker-layers "$layers" \
    --reps "${REPS:-10}" --talker-buckets 1,2,4,8,16 --budget-s "${BUDGET_S:-240}" \
    --stages "${STAGES:-ceilings,thinker,thinker_prefill,talker,vae,talker_throughput}" > "$out/$variant.log" 2>&1
  echo "$variant rc=$?"; grep -E "^\|" "$out/$variant/gpu_bench.md" | head -60
done
