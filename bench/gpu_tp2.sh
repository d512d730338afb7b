#!/usr/bin/env bash
# Two GPUs (nvidia-h200-x2): the real TP=2 checks and benchmarks in one call, in this order:
#   1. every GPU test, one- and two-GPU (TP=2 parity, NCCL, clean shutdown, graphs, kernels; -rA), then the
#      control plane's per-call cost (bench/tp_control_bench.py);
#   2. bench/tp_bench.py --tp 2: thinker decode, all-reduces over NCCL and the symmetric-memory one-shot kernel;
#   3. bench/engine_profile.py on CONFIG: encoder graphed vs eager, stage times per turn, a profiled turn;
#   4. bench/gpu_e2e.sh at LEVELS (TURNS turns per session);
#   5. bench/engine_bench.py on CONFIG: spoken turns through the engine, closed loop at N=4 and 16 (req/s);
#   6. (STEPS=steady only) the steady state at N=32 for each variant in STEADY="name:k=v,k=v;name2:..." (MODE=spoken).
#   bash bench/gpu_tp2.sh OUT_DIR [LEVELS] [CONFIG]      (after `source bench/gpu_setup.sh`)
# Env: STEPS="tests tp profile e2e engine" picks steps; TP_BUDGET_S (default 90) for tp_bench. A step that runs
# past its time limit is aborted with every Python thread's stack in its log (faulthandler).
set -uo pipefail
out=${1:?out dir}; levels=${2:-1,16}; config=${3:-configs/ming-flash-omni-2.0.yaml}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi topo -m > "$out/topo.txt" 2>&1 || true
steps=" ${STEPS:-tests tp profile e2e engine} "
if [[ $steps == *" tests "* ]]; then
  timeout -s ABRT "${TEST_TIMEOUT_S:-420}" python3 -X faulthandler -m pytest -q -rA -p no:cacheprovider -o addopts="" \
    tests/test_gpu_tp.py tests/test_gpu_thinker_decode.py tests/test_gpu_thinker_mixed.py tests/test_gpu_tp_lifecycle.py tests/test_gpu_graphs.py \
    tests/test_gpu_moe.py tests/test_gpu_talker_runner.py tests/test_gpu_talker_pool.py tests/test_gpu_talker_process.py tests/test_gpu_speculation_bound.py tests/test_fused_kernels.py \
    tests/test_thinker_kernels.py tests/test_fused_models.py tests/test_kernel_selection.py \
    tests/test_checkpoint_variants.py tests/test_vae.py tests/test_engine_parts.py > "$out/tests.log" 2>&1
  echo "tests rc=$?"; tail -8 "$out/tests.log"
  timeout 120 python3 -m bench.tp_control_bench --devices cuda:0,cuda:1 --iters 500 --out "$out/tp_control.json" \
    > "$out/tp_control.log" 2>&1
  echo "tp_control_bench rc=$?"; cat "$out/tp_control.json" 2>/dev/null
fi
if [[ $steps == *" tp "* ]]; then
  for ar in ${ALL_REDUCE:-nccl one_shot}; do  # engine.thinker.all_reduce: NCCL vs the symmetric-memory one-shot kernel
    timeout 240 python3 bench/tp_bench.py --tp 2 --all-reduce "$ar" --out "$out/tp-$ar" --budget-s "${TP_BUDGET_S:-90}" \
      --batches 1,16 > "$out/tp-$ar.log" 2>&1
    echo "tp_bench $ar rc=$?"; grep -E "^\| (B|1|16) " "$out/tp-$ar/tp_bench.md" | head -4
  done
fi
if [[ $steps == *" profile "* ]]; then
  timeout -s ABRT "${PROFILE_TIMEOUT_S:-300}" python3 -X faulthandler bench/engine_profile.py --config "$config" --out "$out/profile" > "$out/profile.log" 2>&1
  echo "engine_profile rc=$?"; grep -E "^\| " "$out/profile.log" | head -12
fi
if [[ $steps == *" e2e "* ]]; then
  timeout "${E2E_TIMEOUT_S:-400}" bash bench/gpu_e2e.sh "$out/e2e" "$levels" "$config" > "$out/e2e.log" 2>&1
  echo "e2e rc=$?"; grep -E "admission|TTFA|^\|" "$out/e2e.log" | head -20
  cat "$out/e2e/bench/summary.md" 2>/dev/null | head -30
fi
if [[ $steps == *" engine "* ]]; then
  timeout "${ENGINE_TIMEOUT_S:-300}" python3 -m bench.engine_bench --levels 4,16 --modes spoken --rounds 2 --waves 4 \
    --max-tokens 12 --steps-per-word 2 --config "$config" --set engine.preset=ming-flash-omni-2.0 \
    --set engine.weights=dummy --set engine.segmenter.policy=latency --out "$out/engine" > "$out/engine.log" 2>&1
  echo "engine_bench rc=$?"; grep -A5 "throughput" "$out/engine/engine_bench.md" | tail -3
fi
if [[ $steps == *" steady "* ]]; then
  # the steady state at N=32 (12 closed-loop waves, lengths spread, starts staggered) for each variant of CONFIG in
  # STEADY="name:key=value,key=[1,2],key=value;name2:..." (default: the config as shipped), MODE (spoken) each
  IFS=';' read -ra variants <<< "${STEADY:-shipped:}"
  for variant in "${variants[@]}"; do
    name=${variant%%:*}; sets=()
    # pairs split at commas outside brackets: a list value (key=[1,2,4]) stays one pair
    mapfile -t pairs < <(python3 -c 'import re, sys; print("\n".join(re.split(r",(?![^\[]*\])", sys.argv[1])))' "${variant#*:}")
    for pair in "${pairs[@]}"; do [[ -n $pair ]] && sets+=(--set "$pair"); done
    timeout "${STEADY_TIMEOUT_S:-160}" python3 -m bench.engine_bench --modes "${MODE:-spoken}" --config "$config" \
      --set engine.preset=ming-flash-omni-2.0 --set engine.weights=dummy --max-tokens 12 --steps-per-word 2 \
      --levels 32 --rounds 2 --waves 12 --length-spread 0.5 --stagger-ms 700 "${sets[@]}" --out "$out/steady-$name" \
      > "$out/steady-$name.log" 2>&1
    echo "steady $name rc=$?"; grep -E "^\| 32 " "$out/steady-$name/engine_bench.md" 2>/dev/null
  done
fi
