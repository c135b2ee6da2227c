# scripts/steps.sh — the bounded steps that scripts/gpu-check.sh and
# scripts/many-cores.sh run on a lent machine (sourced, not run).
#
# step NAME SECONDS CMD... runs CMD under a time limit and records PASS or
# FAIL with its duration; with $BUDGET set (seconds for the whole script,
# counted from sourcing), the limit is cut to what is left of it and a step
# with under 30 s left is recorded as SKIP. It returns CMD's status.
# summarize TITLE [FILE] prints the records (and writes them to FILE) and
# returns 1 when one failed.
results=()
steps_start=$SECONDS

step() {
  local name="$1" limit="$2"; shift 2
  echo
  echo "=== $name"
  if [ -n "${BUDGET:-}" ]; then
    local left=$((BUDGET - (SECONDS - steps_start)))
    if [ "$left" -lt 30 ]; then
      results+=("$(printf '%-52s SKIP (%ds of the budget left)' "$name" "$left")")
      return 0
    fi
    [ "$limit" -le "$left" ] || limit=$left
  fi
  local t0=$SECONDS rc=0
  timeout --kill-after=10 "$limit" "$@" || rc=$?
  local verdict=PASS
  [ "$rc" -eq 0 ] || verdict="FAIL (exit $rc)"
  results+=("$(printf '%-52s %s, %ds' "$name" "$verdict" $((SECONDS - t0)))")
  return "$rc"
}

summarize() {
  echo
  echo "=== summary${1:+ ($1)}"
  printf '%s\n' "${results[@]}" | tee "${2:-/dev/null}"
  local r
  for r in "${results[@]}"; do
    case "$r" in *FAIL*) return 1 ;; esac
  done
}
