#!/usr/bin/env bash
# Barge-in as a listener hears it, on a GPU machine: one server (full-size shapes, dummy weights, forced to tell the
# listener bench's story) and `bench.barge_in --listener` against it at each concurrency.
#   bench/gpu_barge_in.sh OUT_DIR [CONCURRENCIES] [CONFIG]      (default: 16,1 and the 4x H200 config)
# Needs `source bench/gpu_setup.sh` first, and the bench's espeak-ng clips rendered on a machine that has espeak-ng
# (the GPU image does not): `REALTIME_MING_ESPEAK_CACHE=.espeak python3 -c "from bench.barge_in import
# listener_clips; listener_clips()"` here, carry `.espeak` there. Random talker weights never say "stop": the
# talker is held to STEPS_PER_WORD (default 1 step = 0.32 s of audio per word, about natural speech), so a reply of
# REPLY_TOKENS (60) plays ~15 s; SHORT_REPLY_TOKENS (100) is the 'generating' trials' (still generating 300 ms in).
set -euo pipefail
out=${1:?out dir}; levels=${2:-16,1}; config=${3:-configs/ming-flash-omni-2.0-h200x4.yaml}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export REALTIME_MING_ESPEAK_CACHE=${REALTIME_MING_ESPEAK_CACHE:-$PWD/.espeak}
story=$(python3 -c 'from bench.barge_in import STORY; print(STORY)')
python3 -c 'import sys; from realtime_ming.cli import main; sys.exit(main(sys.argv[1:]))' serve --config "$config" \
  --port 8765 --set "engine.preset=${PRESET:-ming-flash-omni-2.0}" --set engine.weights=dummy \
  --hook "forced_reply=$story" --hook "steps_per_word=${STEPS_PER_WORD:-1}" \
  > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for i in $(seq 1 400); do
  if python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8765/health")' 2>/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then echo "server died"; tail -50 "$out/server.log"; exit 1; fi
  sleep 1
done
echo "server up after ${i}s"
for c in ${levels//,/ }; do
  echo "== listener c=$c"
  python3 -m bench.barge_in --listener --url ws://127.0.0.1:8765/v1/realtime -c "$c" \
    --short-reply-tokens "${SHORT_REPLY_TOKENS:-100}" --reply-tokens "${REPLY_TOKENS:-60}" ${LISTENER_ARGS:-} --out "$out/listener-c$c.json" | tee "$out/listener-c$c.txt" || true
done
tail -20 "$out/server.log"
