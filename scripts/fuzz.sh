#!/usr/bin/env bash
# Runs every fuzz target of every package for ${FUZZTIME:-10s} each (their seed
# corpora already run as ordinary tests). Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-10s}"
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "fuzz $pkg $target ($fuzztime)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" >/tmp/p2ptrain-fuzz.log 2>&1 || {
      cat /tmp/p2ptrain-fuzz.log; exit 1; }
  done
done
