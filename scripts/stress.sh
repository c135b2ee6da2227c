#!/usr/bin/env bash
# Runs the network-heavy packages repeatedly under the race detector to show
# the suite is stable (not part of scripts/test.sh: it takes a while).
#
#   scripts/stress.sh            # -count 5 of each
#   COUNT=10 scripts/stress.sh   # more repeats
#
# Prints one line per package with its repeat count and result, and exits
# non-zero if any run failed (the failing output is kept in $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
COUNT="${COUNT:-5}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
pkgs=(./node ./train ./allreduce/... ./protocol/... ./gossip ./e2e)
fail=0
for p in "${pkgs[@]}"; do
  log="$OUT/$(echo "${p#./}" | tr -c 'a-zA-Z0-9\n' '-' | sed 's/-*$//').log"
  start=$(date +%s)
  if go test -race -count="$COUNT" -timeout 60m "$p" >"$log" 2>&1; then
    res=ok
  else
    res=FAIL
    fail=1
  fi
  printf '%-16s count=%-3s %-4s %5ss  (%s)\n' "$p" "$COUNT" "$res" "$(( $(date +%s) - start ))" "$log"
done
exit "$fail"
