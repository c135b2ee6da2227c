#!/usr/bin/env bash
# Runs every fuzz target of package compress for ${FUZZTIME:-10s} each.
# Exits non-zero as soon as a target fails.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-10s}"
targets=$(go test -list '^Fuzz' ./compress/ | grep '^Fuzz')
for t in $targets; do
	echo "== $t ($fuzztime)"
	go test -run='^$' -fuzz="^${t}\$" -fuzztime="$fuzztime" ./compress/
done
