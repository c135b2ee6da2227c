#!/usr/bin/env bash
# scripts/cc-table.sh — what the test hosts' TCP congestion control and link
# shaper do to the all-reduce's efficiency at 4 × 100 Mbit/s, so that a reader
# can tell the bed's share of a shortfall from p2ptrain's. For each of four
# network set-ups (htb or tbf shaping, reno or bbr congestion control) it runs
#   - bench/netns.sh --check: plain TCP, every host sending to the next at
#     once; the lowest of the four links' goodput over the shaped rate;
#   - bench/netns.sh with onebit and sign (direct schedule), sint8 and
#     qsgd:bits=4 (ring), 64 MiB, 5 rounds: the efficiency (ideal / median);
# REPEATS times each, and prints one Markdown table of the medians (with the
# lowest and highest run) to stdout, or into the README's cc-table section
# with --readme. Needs root (network namespaces) and both reno and bbr in
# /proc/sys/net/ipv4/tcp_allowed_congestion_control (what a namespace may use).
#
#   [REPEATS=3] scripts/cc-table.sh [--readme]
#
# bench/netns.sh's default is reno (cubic where a namespace may use it); this
# shows why it is not bbr, the default of the machine the README's figures
# come from.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROG=cc-table
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
readme=0
case "${1:-}" in
--readme) readme=1 ;;
-h | --help) help; exit 0 ;;
"") ;;
*) usage_err "unknown argument '$1'" ;;
esac
repeats=${REPEATS:-3}
[[ $repeats =~ ^[1-9][0-9]*$ ]] || usage_err "REPEATS must be a positive integer, not '$repeats'"
allowed=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control 2>/dev/null || true)
for c in reno bbr; do
	grep -qwF "$c" <<<"$allowed" || die "a network namespace may not use $c here (allowed: $allowed)"
done

tmp=$(mktemp -d /tmp/p2pt-cctable.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
bin=$tmp/p2ptrain
go build -C "$ROOT" -o "$bin" ./cmd/p2ptrain

setups=("htb reno" "htb bbr" "tbf reno" "tbf bbr")
rows=("check" "onebit direct" "sign direct" "sint8 ring" "qsgd:bits=4 ring")
declare -A runs=()
for ((r = 1; r <= repeats; r++)); do
	for setup in "${setups[@]}"; do
		read -r shaper cc <<<"$setup"
		net=(--hosts 4 --rate 100mbit --shaper "$shaper" --cc "$cc")
		log=$tmp/check.log
		"$ROOT/bench/netns.sh" --check "${net[@]}" >"$log" 2>&1 || { tail -20 "$log" >&2; die "--check ($setup) failed"; }
		v=$(sed -nE 's/.*all at once:.*ratio ([0-9.]+).*/\1/p' "$log" | sort -g | head -n 1)
		[ -n "$v" ] || { tail -20 "$log" >&2; die "--check ($setup) printed no all-at-once ratio"; }
		runs["check|$setup"]+="$v "
		for row in "${rows[@]:1}"; do
			read -r codec sched <<<"$row"
			log=$tmp/run.log
			"$ROOT/bench/netns.sh" "${net[@]}" --size 64MiB --codec "$codec" --schedule "$sched" --rounds 5 --binary "$bin" >"$log" 2>&1 ||
				{ tail -20 "$log" >&2; die "$codec ($setup) failed"; }
			v=$(field efficiency "$(grep -m1 '^summary:' "$log")")
			[ -n "$v" ] && [ "$v" != - ] || { tail -20 "$log" >&2; die "$codec ($setup) printed no efficiency"; }
			runs["$row|$setup"]+="$v "
		done
		say "run $r of $repeats: $setup done"
	done
done

# cell "v1 v2 ...": the median, and the range when there are several runs.
cell() {
	local m lo hi
	m=$(tr ' ' '\n' <<<"$1" | grep . | median 3)
	lo=$(tr ' ' '\n' <<<"$1" | grep . | sort -g | head -n 1)
	hi=$(tr ' ' '\n' <<<"$1" | grep . | sort -g | tail -n 1)
	if [ "$repeats" -gt 1 ]; then printf '%s (%s–%s)' "$m" "$lo" "$hi"; else printf '%s' "$m"; fi
}
out=$tmp/table.md
{
	printf '| 4 × 100 Mbit/s | htb, reno | htb, bbr | tbf, reno | tbf, bbr |\n|---|---|---|---|---|\n'
	for row in "${rows[@]}"; do
		case $row in
		check) label="plain TCP, all links at once: slowest link's goodput / rate" ;;
		*) read -r codec sched <<<"$row"; label="$codec ($sched), 64 MiB: efficiency" ;;
		esac
		printf '| %s |' "$label"
		for setup in "${setups[@]}"; do printf ' %s |' "$(cell "${runs["$row|$setup"]}")"; done
		printf '\n'
	done
	printf '\n_Generated %s by `scripts/cc-table.sh` (REPEATS=%s: medians, lowest–highest run) at commit %s on %s (%s cores)._\n' \
		"$(date -u +%Y-%m-%d)" "$repeats" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" "$(uname -m)" "$(nproc)"
} >"$out"
if [ "$readme" = 1 ]; then
	"$ROOT/scripts/readme-section.sh" cc-table "$out"
	say "table updated in README.md"
else
	cat "$out"
fi
