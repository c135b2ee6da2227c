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
# The targets are found in the sources (a test file's "func FuzzX("), not with
# `go test -list`, which would build every package's test binary once more
# only to list them.
for pkg in $(find . -name '*_test.go' -not -path '*/testdata/*' -not -path './.git/*' -print0 |
  xargs -0 grep -l '^func Fuzz[A-Za-z0-9_]*(' | xargs -n1 dirname | sort -u); do
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*(' "$pkg"/*_test.go | sed 's/^func //; s/($//' | sort -u); do
    for attempt in 1 2; do
      echo "fuzz ${pkg#./} $target ($fuzztime, attempt $attempt)"
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
