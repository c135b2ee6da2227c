#!/usr/bin/env bash
# scripts/readme-speed.sh — regenerates the README's all-reduce speed table
# from the current code: runs bench/compare.sh (every preset, --rounds 5 by
# default, on network-namespace test hosts; needs root) with --markdown and
# puts the table between the README's speed-table markers. Extra arguments go
# to bench/compare.sh (e.g. --rounds 7, or --preset codecs to rerun one group:
# the table then holds only that group).
#
# Exit status: 0 when every run produced its figures and the README was
# updated, 1 when a run failed (the README is left as it was).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
README=$ROOT/README.md
grep -q '^<!-- speed-table:begin' "$README" || {
	echo "readme-speed: $README lacks the speed-table markers" >&2
	exit 1
}
table=$(mktemp /tmp/p2pt-speed.XXXXXX.md)
runs=$(mktemp /tmp/p2pt-speed.XXXXXX.jsonl)
trap 'rm -f "$table" "$runs"' EXIT
args=("$@")
[[ " ${args[*]-} " == *" --rounds "* ]] || args+=(--rounds 5)
"$ROOT/bench/compare.sh" --markdown "$table" --out "$runs" "${args[@]}"
# The hosts' TCP congestion control, as bench/netns.sh reported it.
tcp=$(sed -nE 's/.*"tcp":"([^"]*)".*/\1/p' "$runs" | sort -u | paste -sd/ -)
{
	printf '\n_Generated %s by `scripts/readme-speed.sh %s` at commit %s on %s (%s cores); the hosts'"'"' TCP: %s._\n' \
		"$(date -u +%Y-%m-%d)" "$*" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
		"$(uname -m)" "$(nproc)" "${tcp:-unknown}"
} >>"$table"
"$ROOT/scripts/readme-section.sh" speed-table "$table"
echo "readme-speed: table updated in $README"
