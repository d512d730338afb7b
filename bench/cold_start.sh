#!/usr/bin/env bash
# Cold start from a full-size checkpoint on disk (issue 45), 4x H200 (nvidia-h200-x4: 235 GB disk; the checkpoint
# is 211 GB, so not on the one-GPU machine's 64 GB):
#   1. bench/write_checkpoint.py CKPT (skipped when CKPT already has its index): random bf16 in the release layout;
#   2. for each CONFIGS entry, bench/cold_start.py --drop-caches: the server from --model-path CKPT, time to ready,
#      storage read, peak host RSS, GPU memory after load. Default: TP=4 bf16 (configs/ming-flash-omni-2.0-x4.yaml)
#      and the one-GPU FP8 config (configs/ming-flash-omni-2.0-1gpu.yaml: quantised while loading, on cuda:0).
#   bash bench/cold_start.sh OUT_DIR [CKPT_DIR]     (after `source bench/gpu_setup.sh`)
# The writing alone takes ~2-4 min at 1-2 GB/s: run `CONFIGS=... ` per call if one call would pass 10 minutes
# (CKPT stays on the machine while it is held). Writes OUT_DIR/<config>/cold_start.json and OUT_DIR/summary.md.
set -uo pipefail
out=${1:?out dir}; ckpt=${2:-/tmp/ming-ckpt}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
df -h "$(dirname "$ckpt")" > "$out/disk.txt" 2>&1; free -g >> "$out/disk.txt" 2>&1
if [ ! -f "$ckpt/model.safetensors.index.json" ]; then
  timeout "${WRITE_TIMEOUT_S:-480}" python3 -m bench.write_checkpoint "$ckpt" > "$out/write.log" 2>&1
  echo "write_checkpoint rc=$?"; tail -2 "$out/write.log"
fi
for config in ${CONFIGS:-configs/ming-flash-omni-2.0-x4.yaml configs/ming-flash-omni-2.0-1gpu.yaml}; do
  name=$(basename "$config" .yaml)
  timeout "${START_TIMEOUT_S:-600}" python3 -m bench.cold_start --config "$config" --model-path "$ckpt" \
    --out "$out/$name" --drop-caches --timeout-s "${READY_TIMEOUT_S:-540}" > "$out/$name.log" 2>&1
  echo "cold_start $name rc=$?"; tail -1 "$out/$name.log"
  { echo "## $name"; cat "$out/$name/cold_start.json" 2>/dev/null; } >> "$out/summary.md"
done
