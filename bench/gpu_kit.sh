# The steps of the one-call GPU kits (fp8_decode_gpu.sh, decode_step_gpu.sh), sourced by them. Each step prints
# "NAME rc=RC (S s)" and its log's tail, and appends its section (a title, then its table or the log's tail) to
# $summary.
#   kit_begin OUT_DIR                        sets out, steps (from STEPS), dry (DRY_RUN), summary (emptied), t0
#   kit_tests LIMIT_S PYTEST_ARGS...         pytest compiled, every tier the args select: the last line, the failures
#   kit_step NAME LOG LIMIT_S TITLE TABLE_MD CMD...   a bench step: TABLE_MD, else the log's last lines matching errors
#   kit_step_ab PLANS LIMIT_S                bench/fp8_step_ab.py over PLANS (step_args, PROFILE): the whole step

kit_begin() {
  out=$1
  mkdir -p "$out"
  export PYTHONUNBUFFERED=1
  steps=" ${STEPS:-tests kernels step} "
  dry=${DRY_RUN:-0}
  summary="$out/summary.md"
  : > "$summary"
  t0=$SECONDS
}

kit_tests() {
  local limit=$1; shift
  timeout -s ABRT "$limit" python3 -X faulthandler -m pytest -q -rA -p no:cacheprovider -o addopts="" "$@" \
    > "$out/tests.log" 2>&1
  echo "tests rc=$? ($((SECONDS - t0)) s)"; tail -3 "$out/tests.log"
  { echo "## tests ($*)"; tail -1 "$out/tests.log"; grep -E "^(FAILED|ERROR)" "$out/tests.log"; } >> "$summary"
}

kit_step() {
  local name=$1 log=$2 limit=$3 title=$4 table=$5; shift 5
  timeout "$limit" "$@" > "$log" 2>&1
  echo "$name rc=$? ($((SECONDS - t0)) s)"; tail -3 "$log"
  { echo "## $title"; cat "$table" 2>/dev/null || grep -E "ms a step|Error|error" "$log" | tail -20; } >> "$summary"
}

kit_step_ab() {
  kit_step fp8_step_ab "$out/step.log" "$2" \
    "whole thinker, one GPU, FP8 experts: graphed decode step per plan (tp_bench.py's method)" \
    "$out/step/fp8_step_ab.md" python3 -m bench.fp8_step_ab --out "$out/step" --plans "$1" "${step_args[@]}" \
    --profile "${PROFILE:-1}"
}
