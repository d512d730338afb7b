#!/usr/bin/env bash
# The process talker on a GPU of its own (2 GPUs; GPU machine, after `source bench/gpu_setup.sh`):
#   bash bench/talker_process_gpu.sh OUT_DIR [PYTEST_NODE_ID ...]
# Runs the test (default: the thinker on cuda:0, the talker's process on cuda:1,
# test_gpu_graphed_talker_in_its_own_process_speaks_as_the_inline_talker[own-gpu]) with a wall-clock limit
# (TALKER_PROCESS_LIMIT_S, default 240: under the test's own 300 s pytest-timeout, which would dump only the parent)
# and, if it is still running then, writes the stacks of the pytest process AND of every process under it (the talker
# child, multiprocessing's trackers) into the same log, OUT_DIR/talker_process.log:
#   1. nvidia-smi (which process holds which GPU, utilisation: a GPU busy at 100 % or idle);
#   2. `py-spy dump` of each process, native frames too where py-spy can (`--native`), when py-spy is installed
#      (bench/gpu_wheels.txt lists it: the download line there puts it in .whl);
#   3. always: SIGABRT to all of them at once, so faulthandler (PYTHONFAULTHANDLER=1, inherited by the spawned child)
#      prints every Python thread's stack to stderr, which is this log (pytest runs with -s: no capture).
# A turn that does not end waits GPU_TURN_WAIT_S (tests/gpu_engine_support.py; set to 600 here, so the hang is
# still live when the stacks are taken). Exit code: the test's, or 124 after a hang.
set -uo pipefail
out=${1:?out dir}; shift
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(
  "tests/test_gpu_thinker_decode.py::test_gpu_graphed_talker_in_its_own_process_speaks_as_the_inline_talker[own-gpu]")
limit=${TALKER_PROCESS_LIMIT_S:-240}
mkdir -p "$out"
log="$out/talker_process.log"
: > "$log"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 GPU_TURN_WAIT_S=${GPU_TURN_WAIT_S:-600}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pyspy=$(command -v py-spy || echo "${PYTHONPATH%%:*}/bin/py-spy")
[ -x "$pyspy" ] || pyspy=""
{ echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null) limit ${limit}s"
  echo "# ${tests[*]}"; nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__)"; } >> "$log" 2>&1

# INFO logs (the child takes the parent's level: its start, captures and failed steps show), native frames in errors
TORCH_SHOW_CPP_STACKTRACES=1 python3 -m pytest -x -v -s -n 0 -p no:cacheprovider --log-cli-level=INFO "${tests[@]}" \
  >> "$log" 2>&1 &
pid=$!

descendants() {  # every process under $1, depth first
  local child
  for child in $(pgrep -P "$1"); do echo "$child"; descendants "$child"; done
}

waited=0
while kill -0 "$pid" 2> /dev/null && [ "$waited" -lt "$limit" ]; do sleep 1; waited=$((waited + 1)); done
if ! kill -0 "$pid" 2> /dev/null; then
  wait "$pid"; rc=$?
  echo "# finished in ${waited}s, rc=$rc" >> "$log"
  echo "talker_process_gpu: rc=$rc in ${waited}s ($log)"
  exit "$rc"
fi

procs=("$pid" $(descendants "$pid"))
{
  echo; echo "######## HANG: still running after ${limit}s; processes: ${procs[*]}"
  nvidia-smi
  nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv
  for p in "${procs[@]}"; do
    echo; echo "######## pid $p (parent $(ps -o ppid= -p "$p" | tr -d ' ')): $(tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null)"
    if [ -n "$pyspy" ]; then
      timeout 60 "$pyspy" dump --native --pid "$p" || timeout 60 "$pyspy" dump --pid "$p" \
        || echo "(py-spy dump failed for $p)"
    else
      echo "(no py-spy: faulthandler's dump follows below)"
    fi
  done
  echo; echo "######## faulthandler (SIGABRT to ${procs[*]}): every Python thread of each process"
} >> "$log" 2>&1
kill -ABRT "${procs[@]}" 2> /dev/null
sleep 10
kill -KILL "${procs[@]}" 2> /dev/null
wait "$pid" 2> /dev/null
echo "######## end" >> "$log"
echo "talker_process_gpu: HANG after ${limit}s, stacks of ${#procs[@]} processes in $log"
exit 124
