#!/usr/bin/env bash
# TTFA through the Ray Serve ingress vs the plain server at c=1 and c=4, tiny model on CPU, on a machine
# with no package registry (the GPU machines: nothing touches the GPU). It runs the comparison of
# bench/ray_direct_compare.sh (same servers, same interleaved rounds, same relay RTT
# and CPU accounting) with every step bounded in time. From the repository root:
#   bash bench/ray_remote_compare.sh OUT          # device tool: carry [".whl", ".turns", ".raypack"]
# Before it: `bash bench/ray_pack.sh` here (builds .raypack/ray-serve-cp312.tar.xz).
# Environment:
#   ROUNDS (3)        interleaved A,B,B,A rounds at each of c=1 and c=4
#   THREADS (2)       torch/OpenMP threads of BOTH servers; run.sh gives the replica 2 Ray CPUs
#   DATA_PATH (direct) the cluster's data path (direct | serve)
#   BUDGET_S (500)    wall-clock budget of the whole script; the comparison gets what setup left
#   RAYSITE (/tmp/raysite), SITE (/tmp/site)  where the Ray pack and the .whl wheels are unpacked
#   RAY_COMPARE_SETUP (1)  0: skip bench/gpu_setup.sh (python3 already has the .whl packages)
# Writes OUT/: compare.log (this script), env.txt (machine, versions, thread settings), and run.sh's
# plain.log, cluster.log, relay_rtt.txt, cpu.txt, results.json, summary.md, plots, plus rounds.txt.
# Exit status: run.sh's (124 when the budget ran out), or the failing setup step's.
set -uo pipefail
OUT=${1:?usage: bash bench/ray_remote_compare.sh OUT}
BUDGET=${BUDGET_S:-500}
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/compare.log") 2>&1
step() { echo "== $(date -u +%H:%M:%S) +$((SECONDS - START))s $*"; }

export CUDA_VISIBLE_DEVICES=""                        # CPU only, both servers and Ray
export OMP_NUM_THREADS=${THREADS:-2} MKL_NUM_THREADS=${THREADS:-2}  # Ray passes it on to the replica
export RAY_USAGE_STATS_ENABLED=0                      # no network: don't try to report usage
# run.sh's bench finds its espeak-ng turns in the default cache; there is no espeak-ng there
TMPD=$(mktemp -d)
export XDG_CACHE_HOME="$TMPD/cache"
mkdir -p "$XDG_CACHE_HOME/realtime-ming"
if [ -d .turns ]; then cp -r .turns "$XDG_CACHE_HOME/realtime-ming/bench-turns"; fi

if [ "${RAY_COMPARE_SETUP:-1}" != 0 ]; then
  step "installing .whl into ${SITE:-/tmp/site}"
  # shellcheck source=bench/gpu_setup.sh
  GPU_SETUP_CHECK=0 source bench/gpu_setup.sh "${SITE:-/tmp/site}" || { echo "gpu_setup failed" >&2; exit 1; }
fi
step "unpacking the Ray Serve pack into ${RAYSITE:-/tmp/raysite}"
# shellcheck source=bench/ray_unpack.sh
source bench/ray_unpack.sh "${RAYSITE:-/tmp/raysite}" > /dev/null || { echo "ray_unpack failed" >&2; exit 1; }
if [ -d "$XDG_CACHE_HOME/realtime-ming/bench-turns" ]; then
  timeout 120 python3 -m bench.env_check --turns-dir "$XDG_CACHE_HOME/realtime-ming/bench-turns" || {
    echo "env_check failed" >&2; exit 1; }
fi
if ! command -v curl > /dev/null; then  # run.sh polls /health/ready with `curl -sf URL`
  mkdir -p "$TMPD/bin"
  printf '#!/bin/sh\nexec python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[-1], timeout=5)" "$@" 2>/dev/null\n' \
    > "$TMPD/bin/curl"
  chmod +x "$TMPD/bin/curl"
  export PATH="$TMPD/bin:$PATH"
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)  nproc: $(nproc)  $(uptime)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "commit: $(git rev-parse --short HEAD 2> /dev/null || echo unknown)"
  echo "OMP_NUM_THREADS=$OMP_NUM_THREADS CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES' ROUNDS=${ROUNDS:-3} DATA_PATH=${DATA_PATH:-direct}"
  echo "PYTHONPATH=$PYTHONPATH"
  timeout 120 python3 - <<'EOF'
import importlib.metadata as md, platform, sys
import torch
print("python", platform.python_version(), sys.executable, "| torch", torch.__version__,
      "threads", torch.get_num_threads(), "| cuda visible", torch.cuda.device_count())
for name in ("ray", "fastapi", "starlette", "uvicorn", "pydantic", "websockets", "aiohttp", "grpcio",
             "protobuf", "uvloop", "httptools", "numpy"):
    try:
        dist = md.distribution(name)
        print(f"  {name} {dist.version} ({dist.locate_file('')})")
    except md.PackageNotFoundError:
        print(f"  {name} missing")
EOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

rc=0
# the comparison gets the budget less ~45 s kept for the servers' shutdown and `ray stop`
run_s=$(($(left) - 45))
if [ "$run_s" -lt 60 ]; then echo "only ${run_s}s left for the comparison" >&2; exit 1; fi
step "run.sh (limit ${run_s}s)"
ROUNDS=${ROUNDS:-3} PYTHON=python3 timeout -k 20 "$run_s" \
  bash bench/ray_direct_compare.sh "$OUT" "${DATA_PATH:-direct}" || rc=$?
step "run.sh exit $rc; stopping what is left of Ray"
timeout 30 python3 -m ray.scripts.scripts stop --force > "$OUT/ray_stop.log" 2>&1 || true
if [ -f "$OUT/results.json" ]; then
  timeout 30 python3 bench/ray_rounds.py "$OUT/results.json" | tee "$OUT/rounds.txt"
fi
rm -rf "$TMPD"
step "done (exit $rc)"
exit "$rc"
