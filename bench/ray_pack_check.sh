#!/usr/bin/env bash
# Check, on this machine, that the stripped Ray Serve pack (bench/ray_pack.sh) is complete: build the
# pack for THIS python3 (the GPU machines get the cp312 one; same versions, same stripping), then a
# venv that holds only the GPU image's packages (bench/gpu_image_packages.txt) and our carried wheels
# (bench/gpu_wheels.txt), as found installed here, and run the remote comparison in it:
#   bash bench/ray_pack_check.sh [OUT_DIR]        # default /tmp/ray-pack-check; ROUNDS default 1
# A package Serve needs that is neither in the image nor in the pack fails the run with an ImportError
# in OUT_DIR/compare/*.log. Packages of the image list that are not installed here are named and
# skipped (the check is only as good as this machine's copy of the image).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-/tmp/ray-pack-check}
TAG=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
cd "$ROOT"
# its own pack folder (default $OUT.pack, kept between runs): .raypack, which is carried, holds only cp312
export RAYPACK_DIR=${RAYPACK_DIR:-$OUT.pack}
[ -f "$RAYPACK_DIR/ray-serve-$TAG.tar.xz" ] || \
  bash bench/ray_pack.sh "$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"

rm -rf "$OUT" && mkdir -p "$OUT"
python3 -m venv --without-pip "$OUT/venv"
SITE=$("$OUT/venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# one symlink per installed file of each listed distribution (namespace packages such as google/ stay
# per-distribution: protobuf's google/protobuf comes in, googleapis' google/api does not)
python3 - "$SITE" bench/gpu_image_packages.txt bench/gpu_wheels.txt > "$OUT/image_site.txt" <<'EOF'
import importlib.metadata as md, os, re, sys
site = sys.argv[1]
names = []
for path in sys.argv[2:]:
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(re.split(r"[=<>!~ ;\[]", line, maxsplit=1)[0])
missing = []
for name in names:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        missing.append(name)
        continue
    for f in dist.files or []:
        rel = str(f)
        if rel.startswith("..") or "__pycache__" in rel or rel.startswith("/"):
            continue
        src, dst = str(dist.locate_file(f)), os.path.join(site, rel)
        if os.path.exists(src) and not os.path.lexists(dst):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(src, dst)
    print(f"{name}=={dist.version}")
print("not installed here (left out of the venv):", " ".join(missing) or "none")
EOF
tail -1 "$OUT/image_site.txt"
# the venv must not see this machine's ray or the serve extras
if PYTHONPATH= "$OUT/venv/bin/python3" -c 'import ray' 2> /dev/null; then echo "venv sees ray before unpacking" >&2; exit 1; fi
export PATH="$OUT/venv/bin:$PATH" PYTHONPATH="$ROOT"
RAY_COMPARE_SETUP=0 ROUNDS=${ROUNDS:-1} RAYSITE="$OUT/raysite" bash bench/ray_remote_compare.sh "$OUT/compare"
