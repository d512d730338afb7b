#!/usr/bin/env bash
# End-to-end TTFA on a GPU machine: our server with the full-size Ming-flash-omni-2.0 shapes (dummy
# bf16 weights, thinker TP over the listed GPUs) + the realtime TTFA benchmark against it.
#   bench/gpu_e2e.sh OUT_DIR [CONCURRENCY] [CONFIG]
# Needs: `source bench/gpu_setup.sh` first (carried wheels of the server extras), espeak-ng turns in .turns/.
# The mode (name it in every result): dummy weights always; a forced reply (random weights rarely say
# anything speakable); POLICY (segmenter policy, default latency; `config` = the config's own), VAD_MS
# (server_vad silence, default 200; `server` = the session default) and MAX_TOKENS (default 48; `server`
# = the session default). SHIPPED=1 sets all three to the shipped configuration's values.
set -euo pipefail
out=${1:?out dir}; levels=${2:-1,4,16}; config=${3:-configs/ming-flash-omni-2.0.yaml}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ "${SHIPPED:-0}" = 1 ]; then POLICY=config VAD_MS=server MAX_TOKENS=server; fi
policy=${POLICY:-latency}; vad_ms=${VAD_MS:-200}; max_tokens=${MAX_TOKENS:-48}
serve_extra=(); bench_extra=()
[ "$policy" = config ] || serve_extra+=(--set "engine.segmenter.policy=$policy")
[ "$vad_ms" = server ] || bench_extra+=(--vad-silence-ms "$vad_ms")
[ "$max_tokens" = server ] || bench_extra+=(--max-output-tokens "$max_tokens")
# COMPARE_SESSION (GA session JSON): a second configuration of the same server, interleaved (A B B A), e.g.
# input transcription on: COMPARE_SESSION='{"audio": {"input": {"transcription": {}}}}'; FORCED_TRANSCRIPT:
# what transcription turns say (once, then stop) instead of the dummy weights' random tokens
[ -z "${COMPARE_SESSION:-}" ] || bench_extra+=(--compare-session "$COMPARE_SESSION" --rounds 2)
[ -z "${FORCED_TRANSCRIPT:-}" ] || serve_extra+=(--hook "forced_transcript=$FORCED_TRANSCRIPT")
# TP_SHADOW=N: the thinker as rank 0 of TP=N alone on its GPU, collectives skipped (bench/configs/shadow-tp2-1gpu.yaml)
[ -z "${TP_SHADOW:-}" ] || serve_extra+=(--hook "tp_shadow=$TP_SHADOW")
# HOOKS: bench/test hooks, space-separated name=value (e.g. "steps_per_word=1": short words from the random talker)
for kv in ${HOOKS:-}; do serve_extra+=(--hook "$kv"); done
# SERVE_SET: more server overrides, space-separated key=value (e.g. "engine.placement.talker_device=cuda:2")
for kv in ${SERVE_SET:-}; do serve_extra+=(--set "$kv"); done
# FRONTENDS=N: the WebSockets in N front-end processes, the engine alone in the main one (server.frontend_processes)
[ -z "${FRONTENDS:-}" ] || serve_extra+=(--set "server.frontend_processes=$FRONTENDS")
echo "mode: policy=$policy vad_silence_ms=$vad_ms max_output_tokens=$max_tokens forced_reply=yes weights=dummy" \
  "frontend_processes=${FRONTENDS:-config}" \
  "compare_session=${COMPARE_SESSION:-none} forced_transcript=${FORCED_TRANSCRIPT:-none} serve_set=${SERVE_SET:-none} hooks=${HOOKS:-none}" | tee "$out/mode.txt"
reply="Sure. The weather today looks sunny, with a light breeze from the west and a high of twenty degrees. "
python3 -c 'import sys; from realtime_ming.cli import main; sys.exit(main(sys.argv[1:]))' serve --config "$config" \
  --port 8765 --set "engine.preset=${PRESET:-ming-flash-omni-2.0}" --set engine.weights=dummy \
  --hook "forced_reply=$reply" "${serve_extra[@]}" \
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
  "${bench_extra[@]}" --turns-cache .turns --no-progress --out "$out/bench" || true
tail -20 "$out/server.log"
