#!/usr/bin/env bash
# TTFA through the Ray Serve cluster (direct data path, one 2-CPU replica) vs the plain server, tiny
# model on CPU, plus the per-frame relay RTT. Run from the repository root:
#   bash bench/ray_direct_compare.sh [OUT_DIR] [DATA_PATH]
# ROUNDS (default 3) sets the interleaved rounds. OUT_DIR defaults to bench/out/ray-direct (git-ignored); DATA_PATH (direct | serve) is the
# cluster's data_path (default direct). Ports 18700 (cluster) and 18701 (plain) must be free.
set -euo pipefail
OUT=${1:-bench/out/ray-direct}
DATA_PATH=${2:-direct}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
FR="forced_reply=Sure. The weather today looks sunny, with a light breeze from the west and a high of twenty degrees. "
CLUSTER_CFG=$(mktemp --suffix=.yaml)
sed "s/^data_path: .*/data_path: $DATA_PATH/" configs/cluster-tiny-cpu.yaml > "$CLUSTER_CFG"

# plain server (same tiny config and overrides as the replica)
$PY -m realtime_ming.cli serve --config configs/tiny-cpu.yaml --port 18701 --set server.limits.max_sessions=4 \
  --hook "$FR" > "$OUT/plain.log" 2>&1 &
PLAIN=$!
# cluster: ONE replica (same engine count), 2 CPUs (= 2 torch threads, like the plain server)
$PY -m realtime_ming.cli serve-cluster --cluster-config "$CLUSTER_CFG" --replicas 1 --num-cpus 2 --port 18700 \
  --hook "$FR" > "$OUT/cluster.log" 2>&1 &
CLUSTER=$!
trap 'kill -INT $CLUSTER 2>/dev/null; kill -TERM $PLAIN 2>/dev/null; wait $CLUSTER $PLAIN 2>/dev/null; rm -f "$CLUSTER_CFG"' EXIT

for url in http://127.0.0.1:18701/health/ready http://127.0.0.1:18700/health/ready; do
  for _ in $(seq 600); do curl -sf "$url" > /dev/null && break; sleep 1; done
  curl -sf "$url" > /dev/null || { echo "not ready: $url" >&2; exit 1; }
done

cpu() {  # cumulative CPU seconds (user+sys) of the processes that carry the sessions
  echo "== $1 $(date -u +%H:%M:%S) $(uptime)"
  ps -eo pid,times,args | grep -E "ServeReplica:realtime-ming|ProxyActor|ServeController|gcs_server|raylet|realtime_ming.cli serve --config" \
    | grep -v grep | awk '{printf "%8s %7ss  %s %s\n", $1, $2, $3, $4}'
}
cpu start > "$OUT/cpu.txt"
# per-frame relay cost (transport only, no engine): 1000 round trips per target, alternating blocks
$PY bench/relay_rtt.py ws://127.0.0.1:18700/v1/realtime ws://127.0.0.1:18701/v1/realtime \
  | tee "$OUT/relay_rtt.txt"
cpu after-relay >> "$OUT/cpu.txt"
# interleaved A,B,B,A rounds
$PY -m bench --url ws://127.0.0.1:18700/v1/realtime --name ray --compare-url ws://127.0.0.1:18701/v1/realtime \
  --compare-name plain -c 1,4 --rounds "${ROUNDS:-3}" --turns 4 --warmup 1 --max-output-tokens 16 --no-progress --out "$OUT"
cpu after-bench >> "$OUT/cpu.txt"
cat "$OUT/cpu.txt"
