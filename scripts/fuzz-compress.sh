#!/usr/bin/env bash
# Runs every fuzz target of package compress for ${FUZZTIME:-10s} each
# (one `go test -fuzz` per target) and exits non-zero on the first failure.
#
# On a loaded machine Go's fuzz coordinator sometimes ends a run that found
# nothing with "context deadline exceeded"; such a run (no new crasher under
# compress/testdata/fuzz) is retried once rather than reported.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-10s}"
targets=$(go test -list '^Fuzz' ./compress/ | grep '^Fuzz')
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in $targets; do
	for attempt in 1 2; do
		echo "== $t ($fuzztime, attempt $attempt)"
		if go test -run='^$' -fuzz="^${t}\$" -fuzztime="$fuzztime" ./compress/ 2>&1 | tee "$log"; then
			break
		fi
		if [[ $attempt == 1 ]] && grep -q 'context deadline exceeded' "$log" &&
			! grep -q 'Failing input written to' "$log"; then
			continue
		fi
		echo "FAIL: $t" >&2
		exit 1
	done
done
echo "all compress fuzz targets passed"
