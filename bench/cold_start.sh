#!/usr/bin/env bash
# Cold start from a full-size checkpoint on disk (issue 45), 4x H200 (nvidia-h200-x4: 235 GB disk; the checkpoint
# is 211 GB, so not on the one-GPU machine's 64 GB):
#   1. bench/write_checkpoint.py CKPT (skipped when CKPT already has its index): random bf16 in the release layout;
#   2. for each CONFIGS entry, bench/cold_start.py --drop-caches: the server from --model-path CKPT, time to ready,
#      storage read (and when the reads ended), peak host RSS, GPU memory after load. Default: TP=4 bf16
#      (configs/ming-flash-omni-2.0-x4.yaml) and the one-GPU FP8 config (configs/ming-flash-omni-2.0-1gpu.yaml:
#      quantised while loading, on cuda:0).
#   bash bench/cold_start.sh OUT_DIR [CKPT_DIR]     (after `source bench/gpu_setup.sh`)
# On a smaller disk, LAYERS="6 2" writes and starts checkpoints of the thinker's first 6, then 2 decoder layers
# (every tensor at full shape, shards of the full checkpoint's size; `write_checkpoint --layers`) and fits
# seconds = fixed + per-layer x layers: the 32-layer figures it prints are estimates, not measurements.
# The writing alone takes ~2-4 min at 1-2 GB/s: run `CONFIGS=... ` per call if one call would pass 10 minutes
# (CKPT stays on the machine while it is held). Writes OUT_DIR/<config>[-L<layers>]/cold_start.json and
# OUT_DIR/summary.md.
set -uo pipefail
out=${1:?out dir}; ckpt=${2:-/tmp/ming-ckpt}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
df -h "$(dirname "$ckpt")" > "$out/disk.txt" 2>&1; free -g >> "$out/disk.txt" 2>&1
configs=${CONFIGS:-configs/ming-flash-omni-2.0-x4.yaml configs/ming-flash-omni-2.0-1gpu.yaml}
for layers in ${LAYERS:-32}; do
  write=(); suffix=""
  [ -n "${LAYERS:-}" ] && write=(--layers "$layers") && suffix="-L$layers"
  # a checkpoint of another layer count is rewritten (its config.json says which)
  python3 -c 'import json, sys
sys.exit(json.load(open(sys.argv[1]))["llm_config"]["num_hidden_layers"] != int(sys.argv[2]))' \
    "$ckpt/config.json" "$layers" 2> /dev/null || rm -rf "$ckpt"
  if [ ! -f "$ckpt/model.safetensors.index.json" ]; then
    timeout "${WRITE_TIMEOUT_S:-480}" python3 -m bench.write_checkpoint "$ckpt" "${write[@]}" \
      > "$out/write$suffix.log" 2>&1
    echo "write_checkpoint$suffix rc=$?"; tail -1 "$out/write$suffix.log"
  fi
  for config in $configs; do
    name=$(basename "$config" .yaml)$suffix
    timeout "${START_TIMEOUT_S:-600}" python3 -m bench.cold_start --config "$config" --model-path "$ckpt" \
      --out "$out/$name" --drop-caches --timeout-s "${READY_TIMEOUT_S:-540}" > "$out/$name.log" 2>&1
    echo "cold_start $name rc=$?"; tail -1 "$out/$name.log"
    { echo "## $name"; cat "$out/$name/cold_start.json" 2> /dev/null; echo; } >> "$out/summary.md"
  done
done
if [ -n "${LAYERS:-}" ]; then
  python3 - "$out" $configs <<'PY' | tee -a "$out/summary.md"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
for config in sys.argv[2:]:
    points = []
    for path in sorted(out.glob(Path(config).stem + "-L*/cold_start.json")):
        r = json.loads(path.read_text())
        if r["ready"]:
            points.append((int(path.parent.name.rsplit("-L", 1)[1]), r))
    if len(points) < 2:
        continue
    (k0, a), (k1, b) = sorted(points, key=lambda p: p[0])[:2]
    print(f"## {Path(config).stem}: fitted on {k0} and {k1} layers, estimated for 32 (not measured)")
    for key in ("seconds_to_ready", "checkpoint_GB"):
        if a.get(key) is None or b.get(key) is None:
            continue
        per = (b[key] - a[key]) / (k1 - k0)
        print(f"- {key}: {a[key]} at {k0}, {b[key]} at {k1}: {per:+.2f} a layer, {a[key] + per * (32 - k0):.1f} at 32")
    print(f"- peak_host_rss_GB: {a['peak_host_rss_GB']} at {k0}, {b['peak_host_rss_GB']} at {k1} (not fitted: the "
          "loader holds one shard at a time)")
PY
fi
