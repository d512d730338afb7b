#!/usr/bin/env bash
# py-spy profiles of the engine's threads in the steady state at N=32 (GPU machine, after `source bench/gpu_setup.sh`;
# the py-spy wheel travels in .whl like the others: `pip download py-spy --no-deps --only-binary=:all: -d .whl`):
#   bash bench/gpu_pyspy.sh OUT_DIR CONFIG [--set KEY=VALUE ...]
# Runs bench.engine_bench twice under `py-spy record --threads --nonblocking`: once with --idle (wall time, waits
# included: OUT/prof-idle.txt.gz) and once with --gil (only while the thread holds the interpreter lock:
# OUT/prof-gil.txt.gz). --nonblocking leaves the process running between samples (the numbers match an unprofiled
# run). Read them with `python -m bench.pyspy_tree OUT/prof-idle.txt.gz realtime-ming-talker-0 TalkerLoop._step`.
set -uo pipefail
out=${1:?out dir}; config=${2:?config}; shift 2
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pyspy=$(command -v py-spy || echo "${PYTHONPATH%%:*}/bin/py-spy")
for mode in idle gil; do
  timeout "${PYSPY_TIMEOUT_S:-200}" "$pyspy" record --threads "--$mode" --nonblocking -r 200 --format raw \
    -o "$out/prof-$mode.txt" -- python3 -m bench.engine_bench --modes spoken --config "$config" \
    --set engine.preset=ming-flash-omni-2.0 --set engine.weights=dummy --max-tokens 12 --steps-per-word 2 \
    --levels 32 --rounds 2 --waves 12 --length-spread 0.5 --stagger-ms 700 "$@" --out "$out/bench-$mode" \
    > "$out/prof-$mode.log" 2>&1
  echo "py-spy $mode rc=$?"; grep -E "^\| 32 " "$out/bench-$mode/engine_bench.md" 2>/dev/null
  gzip -f "$out/prof-$mode.txt"
done
