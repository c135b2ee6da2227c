#!/usr/bin/env bash
# Runs every fuzz target of every package for ${FUZZTIME:-10s} each (their seed
# corpora already run as ordinary tests). Exits non-zero on the first failure.
#
# On a loaded machine Go's fuzz coordinator sometimes ends a run that found
# nothing with "context deadline exceeded"; such a run (no failing input
# written) is retried once rather than reported.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-10s}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    for attempt in 1 2; do
      echo "fuzz ${pkg#github.com/p2ptrain/p2ptrain/} $target ($fuzztime, attempt $attempt)"
      if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" >"$log" 2>&1; then
        break
      fi
      if [ "$attempt" = 1 ] && grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written to' "$log"; then
        continue
      fi
      cat "$log"
      echo "FAIL: $pkg $target" >&2
      exit 1
    done
  done
done
echo "all fuzz targets passed"
