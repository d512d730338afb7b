#!/usr/bin/env bash
# End-to-end TTFA on a GPU machine: our server with the full-size Ming-flash-omni-2.0 shapes (dummy
# bf16 weights, thinker TP over the listed GPUs) + the realtime TTFA benchmark against it.
#   bench/gpu_e2e.sh OUT_DIR [CONCURRENCY] [CONFIG]
# Needs: `source bench/gpu_setup.sh` first (carried wheels of the server extras), espeak-ng turns in .turns/.
set -euo pipefail
out=${1:?out dir}; levels=${2:-1,4,16}; config=${3:-configs/ming-flash-omni-2.0.yaml}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
reply="Sure. The weather today looks sunny, with a light breeze from the west and a high of twenty degrees. "
python3 -c 'import sys; from realtime_ming.cli import main; sys.exit(main(sys.argv[1:]))' serve --config "$config" \
  --port 8765 --set "engine.preset=${PRESET:-ming-flash-omni-2.0}" --set engine.weights=dummy \
  --set "engine.thinker.forced_reply=$reply" --set engine.segmenter.policy=latency \
  > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for i in $(seq 1 300); do
  if python3 -c 'import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("http://127.0.0.1:8765/health").read().decode())' > "$out/health.json" 2>/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then echo "server died"; tail -50 "$out/server.log"; exit 1; fi
  sleep 1
done
echo "server up after ${i}s"; cat "$out/health.json"; echo
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$out/gpus.csv" || true
python3 -m bench --url ws://127.0.0.1:8765/v1/realtime -c "$levels" --turns "${TURNS:-2}" --warmup 1 \
  --vad-silence-ms 200 --max-output-tokens 48 --turns-cache .turns --no-progress --out "$out/bench" || true
tail -20 "$out/server.log"
