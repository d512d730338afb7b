# Source this on a GPU machine, in the repository root, before serving or benchmarking there:
#   source bench/gpu_setup.sh [SITE_DIR]        # device tool: carry [".whl", ".turns"]
# The golden fixtures the GPU tests compare against are in the repository (tests/fixtures/).
# The GPU image has torch, numpy, triton, aiohttp, uvloop, onnxruntime, tokenizers, safetensors,
# prometheus-client, pyyaml, pillow and tqdm, and no package registry. The rest of the runtime
# requirements travel as cp312 manylinux wheels in .whl/ (git-ignored; bench/gpu_wheels.txt lists
# them and holds the pip download line). This
#   1. installs .whl/*.whl into SITE_DIR (default /tmp/site), no index, no dependency resolution;
#   2. exports PYTHONPATH=SITE_DIR:$PWD (plus any PYTHONPATH already set);
#   3. runs `python3 -m bench.env_check --turns-dir .turns`: pyproject requirements in range, every
#      realtime_ming and bench module imports, soundfile/soxr/webrtcvad/Silero/inflect work, the
#      espeak-ng turns are there. It prints only the failures (GPU_SETUP_CHECK=0 skips it).
# Returns (or exits, when run instead of sourced) non-zero when the install or a check fails.
# Runs in the caller's shell: no `set -e`, and every name it leaves behind starts with _gpu_setup.

_gpu_setup_site=${1:-/tmp/site}
_gpu_setup_rc=0
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$_gpu_setup_site" .whl/*.whl || _gpu_setup_rc=$?
else
  echo "gpu_setup: no wheels in $PWD/.whl (carry .whl); using the image's packages only" >&2
fi
export PYTHONPATH="$_gpu_setup_site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$_gpu_setup_rc" -eq 0 ] && [ "${GPU_SETUP_CHECK:-1}" != 0 ]; then
  python3 -m bench.env_check --turns-dir .turns || _gpu_setup_rc=$?
fi
(return 0 2> /dev/null) && return "$_gpu_setup_rc"
exit "$_gpu_setup_rc"
