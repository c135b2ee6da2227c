#!/usr/bin/env bash
# scripts/chaos-table.sh — runs the chaos suite (e2e/chaos: p2ptrain
# processes on network-namespace hosts facing crashes, pauses, partitions,
# packet loss and misbehaving members; needs root, about 10 minutes) and puts
# its table (case, time to recover, step attempts lost, peak RSS) between the
# README's chaos-table markers. Exit status 1 when a case fails (the README
# is left as it was).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
table=$(mktemp /tmp/p2pt-chaos.XXXXXX.md)
trap 'rm -f "$table"' EXIT
cd "$ROOT"
P2PTRAIN_CHAOS_TABLE=$table go test -count=1 -timeout 40m -v ./e2e/chaos 2>&1 | grep -E '^(=== RUN|\s*--- |PASS|FAIL|ok)|chaos_test.go:[0-9]+: [a-z]'
test "${PIPESTATUS[0]}" -eq 0
printf '\n_Generated %s by `scripts/chaos-table.sh` at commit %s on %s (%s cores)._\n' \
	"$(date -u +%Y-%m-%d)" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$(uname -m)" "$(nproc)" >>"$table"
scripts/readme-section.sh chaos-table "$table"
echo "chaos-table: table updated in README.md"
