# Unpack the Ray Serve site that bench/ray_pack.sh built, on a machine with no package registry, in the
# repository root (device tool: carry ".raypack" beside ".whl"):
#   source bench/ray_unpack.sh [DEST]            # default /tmp/raysite; exports PYTHONPATH
#   eval "$(bash bench/ray_unpack.sh [DEST])"    # the same, for a shell that should not source it
# It picks .raypack/ray-serve-cpXY.tar.xz (or RAYPACK_DIR's) for this python3, extracts it into DEST (once: a DEST that
# already holds this archive's ray is reused), puts DEST on PYTHONPATH after what is there (after
# bench/gpu_setup.sh's SITE_DIR and the repository) and checks that `from ray import serve` and
# realtime_ming.cluster import. Prints the `export PYTHONPATH=...` line on stdout.
# Runs in the caller's shell: no `set -e`; every name it leaves behind starts with _ray_unpack.

_ray_unpack_dest=${1:-/tmp/raysite}
_ray_unpack_rc=0
_ray_unpack_tag=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
_ray_unpack_archive="${RAYPACK_DIR:-.raypack}/ray-serve-$_ray_unpack_tag.tar.xz"
if [ ! -f "$_ray_unpack_archive" ]; then
  echo "ray_unpack: no $_ray_unpack_archive (build it with bash bench/ray_pack.sh and carry .raypack)" >&2
  _ray_unpack_rc=1
elif [ -f "$_ray_unpack_dest/.ray_unpack_stamp" ] && \
     [ "$(cat "$_ray_unpack_dest/.ray_unpack_stamp")" = "$(cksum < "$_ray_unpack_archive")" ]; then
  : # already unpacked from this very archive
else
  rm -rf "$_ray_unpack_dest" && mkdir -p "$_ray_unpack_dest" &&
    timeout 300 tar -C "$_ray_unpack_dest" -xJf "$_ray_unpack_archive" &&
    cksum < "$_ray_unpack_archive" > "$_ray_unpack_dest/.ray_unpack_stamp" || _ray_unpack_rc=$?
fi
if [ "$_ray_unpack_rc" -eq 0 ]; then
  case ":${PYTHONPATH:-}:" in
    *":$_ray_unpack_dest:"*) ;;
    *) export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$_ray_unpack_dest" ;;
  esac
  timeout 120 python3 -c 'import ray; from ray import serve; import fastapi, uvicorn, pydantic
import realtime_ming.cluster.app
import os, sys
print("ray_unpack: ray", ray.__version__, "from", os.path.dirname(os.path.dirname(ray.__file__)), file=sys.stderr)' \
    >&2 || _ray_unpack_rc=$?
  echo "export PYTHONPATH=\"$PYTHONPATH\""
fi
(return 0 2> /dev/null) && return "$_ray_unpack_rc"
exit "$_ray_unpack_rc"
