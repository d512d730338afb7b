#!/usr/bin/env bash
# The process talker on a GPU of its own (2 GPUs; GPU machine, after `source bench/gpu_setup.sh`):
#   bash bench/talker_process_gpu.sh OUT_DIR [PYTEST_NODE_ID ...]
# Without node ids it runs two stages, each its own pytest run under its own wall-clock limit
# (TALKER_PROCESS_LIMIT_S, default 240 s: under the tests' own 300 s pytest-timeout, which would dump only the parent),
# so the first that fails says where the fault lives:
#   1. alone: talker processes on cuda:0 and cuda:1 with no thinker (test_gpu_talker_pool.py, the process pool's
#      graphed PCM against the single runner's): the child on a second GPU by itself;
#   2. engine: the thinker on cuda:0, the talker's process on cuda:1
#      (test_gpu_graphed_talker_in_its_own_process_speaks_as_the_inline_talker[own-gpu]).
# With node ids: one stage of those. Everything goes to one log, OUT_DIR/talker_process.log:
#   * the talker children's start-up phases at INFO (`engine/talker_child.py`: started, device current, weights
#     received and adopted, runner built, loop thread on its device, graphs capturing / captured, first op, first
#     step launched / finished, first output sent), gathered into OUT_DIR/phases.txt at the end; a turn that does not
#     end (GPU_TURN_WAIT_S, 180 s here) fails with each child's last phase and both processes' Python stacks;
#   * if a stage is still running at its limit: nvidia-smi; `py-spy dump --native` of every process under pytest (if
#     py-spy is installed: bench/gpu_wheels.txt); then SIGABRT to all of them (faulthandler, PYTHONFAULTHANDLER=1:
#     every Python thread, the talker children's too, even one still importing).
# Exit code: the first failing stage's (124 after a hang), else 0.
set -uo pipefail
out=${1:?out dir}; shift
limit=${TALKER_PROCESS_LIMIT_S:-240}
mkdir -p "$out"
log="$out/talker_process.log"
: > "$log"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 GPU_TURN_WAIT_S=${GPU_TURN_WAIT_S:-180}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pyspy=$(command -v py-spy || echo "${PYTHONPATH%%:*}/bin/py-spy")
[ -x "$pyspy" ] || pyspy=""
{ echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null) limit ${limit}s per stage"
  nvidia-smi -L; nvidia-smi topo -m; python3 -c "import torch; print('torch', torch.__version__)"; } >> "$log" 2>&1

descendants() {  # every process under $1, depth first
  local child
  for child in $(pgrep -P "$1"); do echo "$child"; descendants "$child"; done
}

stage() {  # stage NAME NODE_ID... -> the stage's exit code (124: still running at the limit, stacks taken)
  local name=$1; shift
  echo; echo "######## stage $name: $*" >> "$log"
  # INFO logs (the child takes the parent's level: its phases, captures and failed steps show), C++ frames in errors
  TORCH_SHOW_CPP_STACKTRACES=1 python3 -m pytest -x -v -s -n 0 -p no:cacheprovider -o addopts="" \
    --log-cli-level=INFO "$@" >> "$log" 2>&1 &
  local pid=$! waited=0 rc
  while kill -0 "$pid" 2> /dev/null && [ "$waited" -lt "$limit" ]; do sleep 1; waited=$((waited + 1)); done
  if ! kill -0 "$pid" 2> /dev/null; then
    wait "$pid"; rc=$?
    echo "######## stage $name finished in ${waited}s, rc=$rc" >> "$log"
    echo "talker_process_gpu: stage $name rc=$rc in ${waited}s"
    return "$rc"
  fi
  local procs=("$pid" $(descendants "$pid")) p
  {
    echo; echo "######## HANG in stage $name: still running after ${limit}s; processes: ${procs[*]}"
    nvidia-smi
    nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv
  } >> "$log" 2>&1
  for p in "${procs[@]}"; do
    {
      echo; echo "######## pid $p (parent $(ps -o ppid= -p "$p" | tr -d ' ')): $(tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null)"
      if [ -n "$pyspy" ]; then
        timeout 60 "$pyspy" dump --native --pid "$p" || timeout 60 "$pyspy" dump --pid "$p" \
          || echo "(py-spy dump failed for $p)"
      else
        echo "(no py-spy: faulthandler's dump follows below)"
      fi
    } >> "$log" 2>&1
  done
  echo; echo "######## faulthandler (SIGABRT to ${procs[*]}): every Python thread of each process" >> "$log"
  kill -ABRT "${procs[@]}" 2> /dev/null
  sleep 10
  kill -KILL "${procs[@]}" 2> /dev/null
  wait "$pid" 2> /dev/null
  echo "######## stage $name: end" >> "$log"
  echo "talker_process_gpu: stage $name HANG after ${limit}s, stacks of ${#procs[@]} processes in $log"
  return 124
}

rc=0
if [ $# -gt 0 ]; then
  stage given "$@" || rc=$?
else
  stage alone \
    "tests/test_gpu_talker_pool.py::test_graphed_pool_with_a_process_per_gpu_speaks_as_the_single_runner[1-False]" \
    || rc=$?
  stage engine \
    "tests/test_gpu_thinker_decode.py::test_gpu_graphed_talker_in_its_own_process_speaks_as_the_inline_talker[own-gpu]" \
    || { r=$?; [ "$rc" -ne 0 ] || rc=$r; }
fi
grep -E "talker process [0-9]+ \(|talker process [0-9]+: |did not (start|end)|no graph capture" "$log" \
  > "$out/phases.txt" 2> /dev/null
echo "talker_process_gpu: rc=$rc; phases in $out/phases.txt, everything in $log"
exit "$rc"
