#!/usr/bin/env bash
# Runs p2ptrain's whole test suite: set-up, vet, every package's tests under the
# race detector (including the slow multi-process suite in e2e/), then the
# fuzz targets' seed corpora and a short fuzzing run of each.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

echo "== go vet"
go vet ./...

echo "== unit and integration tests (race detector)"
go test -race -count=1 -timeout 20m $(go list ./... | grep -v /e2e)

echo "== pure-Go twins of the assembly kernels"
go test -count=1 -tags purego ./compress/... ./gpu/sgemm/...

echo "== multi-process suite (slow: runs the built binary as several peers)"
go test -count=1 -timeout 10m -v ./e2e 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go'
test "${PIPESTATUS[0]}" -eq 0

echo "== network-namespace smoke benchmark (3 shaped hosts; skipped unless root)"
go build -o bin/p2ptrain ./cmd/p2ptrain
bench/netns.sh --smoke --binary bin/p2ptrain

echo "== fuzzing (${FUZZTIME:=10s} per target)"
FUZZTIME="$FUZZTIME" scripts/fuzz.sh
