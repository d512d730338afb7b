#!/usr/bin/env bash
# GPU replicas behind the Ray Serve ingress (issue 45), one GPU per replica, dummy weights at full shapes:
#   overhead  the ingress's TTFA_server overhead against a direct connection: one replica on cuda:0 behind the
#             ingress vs a plain `realtime-ming serve` on the last GPU, same config, interleaved rounds at LEVELS
#             (default 16,32,64: c=32 is what the scale stage asks of each replica; `python -m bench
#             --compare-url`), then bench/ray_rounds.py's per-round differences. Sessions served in one process
#             (FRONTENDS=1) did not carry c=32 on one H200 (bench/results/gpu-h200x2-ray-replicas-2026-11-29/).
#             On one GPU the two take turns on it instead: ROUNDS rounds (2), each starting both afresh, one after
#             the other, the first alternating (FIRST=ray or plain: round 1's);
#   scale     (every GPU): REPLICAS replicas (default: one per GPU) behind the ingress, the sessions spread by load,
#             aggregate TTFA and playback stalls at SCALE_C (default 32 per replica), each replica admitting
#             REPLICA_SESSIONS (32);
#   kill      (after scale, same cluster): bench/ray_kill.py: KILL_SESSIONS sessions mid-reply, the fullest replica's
#             actor killed: its sessions end replica_lost / 1012, the others' replies go on without a stall, new
#             sessions go to the survivors.
#   bash bench/ray_gpu.sh OUT          # device tool: carry .whl, .turns, .raypack as below; STAGES="overhead" or
#                                      # "scale kill" (default: all three; ~10 min on 4x H200, so two calls)
# The tree, .whl (21 MB) and .raypack (25 MB, `bash bench/ray_pack.sh` here) pass the tool's 64 MiB together, and a
# carried path not named again is gone in the next call: carry [".raypack"] in a first call that copies it out of
# the tree (`mkdir -p /tmp/raypack_keep && cp .raypack/* /tmp/raypack_keep/`), then, within 30 s while the machine is
# warm, carry [".whl", ".turns"] with RAYPACK_DIR=/tmp/raypack_keep (bench/ray_unpack.sh reads it).
# Env: CONFIG (configs/ming-flash-omni-2.0-1gpu.yaml), MODEL_SET (server overrides, default "engine.preset=
# ming-flash-omni-2.0 engine.weights=dummy"), TURNS (2), MAX_TOKENS (48), VAD_MS (200), GPUS (nvidia-smi's count;
# 0 = CPU only: how this script is checked without a GPU, e.g. CONFIG=configs/tiny-cpu.yaml MODEL_SET= GPUS=0
# REPLICAS=2 SETUP=0; the one-GPU overhead branch with GPUS=1 GPUS_PER_REPLICA=0 STAGES=overhead), READY_S (600),
# SETUP (1: gpu_setup + ray_unpack), FRONTENDS (server.frontend_processes of both targets; default the config's:
# a replica on the direct data path runs its front-end processes as the plain server does), so the ingress is the
# only difference.
# Writes OUT/<stage>/ (server and cluster logs, the bench's summary.md and results.json, ray_kill.md) and
# OUT/summary.md.
# Each stage ends with `ray stop --force`: every Ray instance on the machine stops (run it on a machine of its own).
set -uo pipefail
out=${1:?usage: bash bench/ray_gpu.sh OUT}
mkdir -p "$out"; out=$(cd "$out" && pwd)
config=${CONFIG:-configs/ming-flash-omni-2.0-1gpu.yaml}
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
if [ "${SETUP:-1}" = 1 ]; then
  # shellcheck source=bench/gpu_setup.sh
  # (a sourced script without arguments would see this script's own: OUT as its folder)
  GPU_SETUP_CHECK=0 source bench/gpu_setup.sh /tmp/site > "$out/setup.log" 2>&1 || { echo "gpu_setup failed"; exit 1; }
  # shellcheck source=bench/ray_unpack.sh
  source bench/ray_unpack.sh /tmp/raysite > /dev/null || { echo "ray_unpack failed"; exit 1; }
fi
gpus=${GPUS:-$(nvidia-smi -L 2> /dev/null | wc -l)}
reply="Sure. The weather today looks sunny, with a light breeze from the west and a high of twenty degrees. "
model=(--hook "forced_reply=$reply")
# FRONTENDS: server.frontend_processes of the replicas and the plain server alike (default: the config's; 1 = the
# sessions in the engine's process, a replica's actor)
[ -z "${FRONTENDS:-}" ] || model+=(--set "server.frontend_processes=$FRONTENDS")
for kv in ${MODEL_SET-engine.preset=ming-flash-omni-2.0 engine.weights=dummy}; do model+=(--set "$kv"); done
bench_args=(--turns "${TURNS:-2}" --warmup 1 --vad-silence-ms "${VAD_MS:-200}" --max-output-tokens "${MAX_TOKENS:-48}"
            --turns-cache .turns --no-progress)
pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill -INT "$pid" 2> /dev/null; done
  for pid in "${pids[@]}"; do timeout 60 tail --pid="$pid" -f /dev/null; kill -9 "$pid" 2> /dev/null; done
  pids=()
  timeout 60 python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
}
trap stop_all EXIT
wait_ready() {  # URL LOG PID: poll /health/ready (or /health) until 200, bounded
  for _ in $(seq "${READY_S:-600}"); do
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$1" 2> /dev/null && return 0
    kill -0 "$3" 2> /dev/null || { echo "died before ready: $2"; tail -30 "$2"; return 1; }
    sleep 1
  done
  echo "not ready after ${READY_S:-600} s: $1"; tail -30 "$2"; return 1
}
cluster() {  # DIR REPLICAS VISIBLE_GPUS [ARGS...]: the ingress on :8700, one replica per GPU, every replica healthy
  local per=${GPUS_PER_REPLICA:-1}; [ "$gpus" = 0 ] && per=0
  CUDA_VISIBLE_DEVICES=$3 python3 -m realtime_ming.cli serve-cluster --config "$config" --replicas "$2" \
    --num-gpus "$per" --num-cpus "${CPUS_PER_REPLICA:-5}" --port 8700 "${model[@]}" "${@:4}" > "$1/cluster.log" 2>&1 &
  pids+=($!)
  wait_ready http://127.0.0.1:8700/health/ready "$1/cluster.log" "$!" || return 1
  # /health/ready answers 200 once one replica is up: wait for all of them (bounded), or a burst finds one
  for _ in $(seq "${READY_S:-600}"); do
    python3 -c 'import json, sys, urllib.request
health = json.loads(urllib.request.urlopen(sys.argv[1], timeout=5).read())
sys.exit(health.get("healthy_replicas", 0) < int(sys.argv[2]))' http://127.0.0.1:8700/health "$2" 2> /dev/null && return 0
    sleep 1
  done
  echo "fewer than $2 healthy replicas after ${READY_S:-600} s"; tail -30 "$1/cluster.log"; return 1
}
plain_server() {  # LOG VISIBLE_GPUS: a plain `realtime-ming serve` on :8701 in the background (its pid: $plain)
  CUDA_VISIBLE_DEVICES=$2 python3 -m realtime_ming.cli serve --config "$config" --port 8701 "${model[@]}" > "$1" 2>&1 &
  plain=$!
  pids+=("$plain")
}
all_gpus=$(seq -s, 0 $((gpus > 0 ? gpus - 1 : 0))); [ "$gpus" = 0 ] && all_gpus=""
stages=" ${STAGES:-overhead scale kill} "
: > "$out/summary.md"

if [[ $stages == *" overhead "* ]]; then
  d="$out/overhead"; mkdir -p "$d"
  if [ "$gpus" = 1 ]; then
    # one GPU: the two targets take turns on it, a fresh start each round, the first in each round alternating
    for r in $(seq "${ROUNDS:-2}"); do
      order="ray plain"; [ "${FIRST:-ray}" = plain ] && order="plain ray"
      [ $((r % 2)) = 0 ] && order=$(echo "$order" | awk '{print $2, $1}')
      for target in $order; do
        t="$d/$target-r$r"; mkdir -p "$t"
        if [ "$target" = plain ]; then
          plain_server "$t/server.log" 0
          wait_ready http://127.0.0.1:8701/health/ready "$t/server.log" "$plain" || { stop_all; continue; }
          url=ws://127.0.0.1:8701/v1/realtime
        else
          cluster "$t" 1 0 || { stop_all; continue; }
          url=ws://127.0.0.1:8700/v1/realtime
        fi
        timeout "${OVERHEAD_TIMEOUT_S:-420}" python3 -m bench --url "$url" --name "$target" -c "${LEVELS:-16,32,64}" \
          "${bench_args[@]}" --out "$t/bench" > "$t/bench.log" 2>&1
        echo "overhead round $r $target rc=$?"
        stop_all
      done
    done
    python3 bench/ray_rounds.py "$d"/ray-r*/bench/results.json "$d"/plain-r*/bench/results.json | tee "$d/rounds.txt"
    { echo "## overhead (one replica behind the ingress vs a plain server, taking turns on one GPU)"; echo
      for f in "$d"/*-r*/bench/summary.md; do grep -E "^\| (ray|plain) .*%" "$f" | head -4; done; echo
      cat "$d/rounds.txt"; echo; } >> "$out/summary.md"
  else
    plain_gpu=$((gpus > 0 ? gpus - 1 : 0)); [ "$gpus" = 0 ] && plain_gpu=""
    plain_server "$d/plain.log" "$plain_gpu"
    replica_gpu=0; [ "$gpus" = 0 ] && replica_gpu=""
    if cluster "$d" 1 "$replica_gpu" && wait_ready http://127.0.0.1:8701/health "$d/plain.log" "$plain"; then
      timeout "${OVERHEAD_TIMEOUT_S:-420}" python3 -m bench --url ws://127.0.0.1:8700/v1/realtime --name ray \
        --compare-url ws://127.0.0.1:8701/v1/realtime --compare-name plain -c "${LEVELS:-16,32,64}" \
        --rounds "${ROUNDS:-2}" "${bench_args[@]}" --out "$d/bench" > "$d/bench.log" 2>&1
      echo "overhead bench rc=$?"
      python3 bench/ray_rounds.py "$d/bench/results.json" | tee "$d/rounds.txt"
      { echo "## overhead (one replica behind the ingress vs a plain server, one GPU each)"; echo
        grep -E "^\| (target|---|ray|plain) " "$d/bench/summary.md" | head -12; echo; cat "$d/rounds.txt"; echo; } \
        >> "$out/summary.md"
    fi
    stop_all
  fi
fi

if [[ $stages == *" scale "* || $stages == *" kill "* ]]; then
  d="$out/scale"; mkdir -p "$d"
  replicas=${REPLICAS:-$((gpus > 0 ? gpus : 2))}
  # each replica admits REPLICA_SESSIONS (32: c=128 over 4 replicas), so a burst that Serve's router spreads
  # unevenly fills the others instead of overloading one
  if cluster "$d" "$replicas" "$all_gpus" --set "server.limits.max_sessions=${REPLICA_SESSIONS:-32}"; then
    python3 -c 'import json, sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' \
      http://127.0.0.1:8700/health > "$d/health.json"
    if [[ $stages == *" scale "* ]]; then
      c=${SCALE_C:-$((32 * replicas))}
      # how the sessions spread: each replica's open sessions, sampled every second while the bench runs
      python3 - http://127.0.0.1:8700/health > "$d/spread.jsonl" 2> /dev/null <<'PY' &
import json, sys, time, urllib.request
while True:
    health = json.loads(urllib.request.urlopen(sys.argv[1], timeout=5).read())
    print(json.dumps({r["replica"]: r["sessions"] for r in health["replicas"]}), flush=True)
    time.sleep(1)
PY
      poller=$!
      timeout "${SCALE_TIMEOUT_S:-300}" python3 -m bench --url ws://127.0.0.1:8700/v1/realtime --name ray \
        -c "$c" "${bench_args[@]}" --out "$d/bench" > "$d/bench.log" 2>&1
      echo "scale bench c=$c rc=$?"
      kill "$poller" 2> /dev/null
      spread=$(python3 -c 'import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
peak = max(rows, key=lambda r: sum(v or 0 for v in r.values()), default={})
print("sessions per replica at the busiest sample:", dict(sorted(peak.items())))' "$d/spread.jsonl")
      echo "$spread"
      { echo "## scale ($replicas replicas, c=$c through the ingress)"; echo
        grep -E "^\| (target|---|ray) " "$d/bench/summary.md" | head -6; echo; echo "$spread"; echo; } >> "$out/summary.md"
    fi
    if [[ $stages == *" kill "* ]]; then
      timeout "${KILL_TIMEOUT_S:-300}" python3 -m bench.ray_kill --url ws://127.0.0.1:8700/v1/realtime \
        --sessions "${KILL_SESSIONS:-$((8 * replicas))}" --stall-ms "${KILL_STALL_MS:-200}" --out "$d/kill" \
        > "$d/kill.log" 2>&1
      echo "kill rc=$?"
      { echo "## kill"; echo; sed 1d "$d/kill/ray_kill.md" 2> /dev/null || tail -20 "$d/kill.log"; echo; } \
        >> "$out/summary.md"
    fi
  fi
  stop_all
fi
cat "$out/summary.md"
