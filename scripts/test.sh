#!/usr/bin/env bash
# Runs p2ptrain's whole test suite: set-up, vet, every package's tests under the
# race detector (including the slow multi-process suite in e2e/), then the
# fuzz targets' seed corpora and a short fuzzing run of each.
set -euo pipefail
cd "$(dirname "$0")/.."

# stage NAME starts a stage; the time each took is printed at the end.
timings=()
stage_name=""
stage_start=$SECONDS
stage() {
  if [ -n "$stage_name" ]; then timings+=("$(printf '%5ds  %s' $((SECONDS - stage_start)) "$stage_name")"); fi
  stage_name="$1"
  stage_start=$SECONDS
  [ -n "$1" ] && echo "== $1"
  return 0
}

stage "set-up"
scripts/setup.sh

stage "go vet"
go vet ./...

stage "unit and integration tests (race detector)"
go test -race -count=1 -timeout 20m $(go list ./... | grep -v /e2e)

stage "pure-Go twins of the assembly kernels"
go test -count=1 -tags purego ./compress/... ./gpu/sgemm/...

stage "PyTorch bridge: the Python package's unit tests (Debian's python3 with python3-torch)"
/usr/bin/python3 -m unittest discover -s python/tests -t python

stage "multi-process suite (slow: runs the built binary as several peers)"
# The full output goes to a file; the summary lines are shown, and on a
# failure everything the failing tests printed (the peers' last log lines
# are indented, which the summary's filter drops).
e2e_log=$(mktemp)
set +e
go test -count=1 -timeout 10m -v -skip '^TestNATTraversal$' ./e2e >"$e2e_log" 2>&1
e2e_rc=$?
set -e
grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go' "$e2e_log" || true
if [ "$e2e_rc" -ne 0 ]; then
  echo "== multi-process suite failed (exit $e2e_rc): its output without the passing tests' lines"
  awk '/^=== RUN/ {next} /^--- PASS/ {next} {print}' "$e2e_log" | cut -c 1-400 | tail -n 400
fi
rm -f "$e2e_log"
test "$e2e_rc" -eq 0

stage "network-namespace smoke benchmark (3 shaped hosts; skipped unless root)"
go build -o bin/p2ptrain ./cmd/p2ptrain
bench/netns.sh --smoke --binary bin/p2ptrain

stage "NAT traversal (slow multi-process suite: relays and hole punching between network-namespace NATs; skipped unless root)"
go test -count=1 -timeout 6m -v -run '^TestNATTraversal$' ./e2e 2>&1 | grep -E '^(=== RUN|\s*--- |PASS|FAIL|ok|panic)|nat_test.go|^\s*nat[: ]'
test "${PIPESTATUS[0]}" -eq 0

stage "chaos suite (slow: 5 processes per case on network-namespace hosts; skipped unless root)"
# The full output goes to a file; the summary lines are shown, and on a
# failure each process's last log lines, which the test prints indented.
chaos_log=$(mktemp)
set +e
go test -count=1 -timeout 30m -v ./e2e/chaos >"$chaos_log" 2>&1
chaos_rc=$?
set -e
grep -E '^(=== RUN|\s*--- |PASS|FAIL|ok|panic)|chaos_test.go:[0-9]+: [a-z|]|^\s+\|' "$chaos_log" || true
if [ "$chaos_rc" -ne 0 ]; then
  echo "== chaos suite failed (exit $chaos_rc): the processes' last lines"
  grep -A 41 -E 'chaos_test.go:[0-9]+: .*last lines:' "$chaos_log" | cut -c 1-400 || tail -n 200 "$chaos_log"
  echo "== where the processes still running at the failure were waiting (from a goroutine dump)"
  awk '/goroutines waiting a minute/ {n = 1; print; next} n && /^ +\[/ {print; next} {n = 0}' "$chaos_log" | cut -c 1-400
  echo "== the failures"
  grep -E 'chaos_test.go:[0-9]+: ' "$chaos_log" | grep -vE 'last lines:|goroutines waiting|chaos table:' | cut -c 1-400 || true
fi
rm -f "$chaos_log"
test "$chaos_rc" -eq 0

stage "fuzzing (${FUZZTIME:=5s} per target)"
FUZZTIME="$FUZZTIME" scripts/fuzz.sh

stage ""
echo "== time per stage"
printf '%s\n' "${timings[@]}"
