#!/usr/bin/env bash
# bench/compare.sh — runs bench/netns.sh several times (codecs × schedules on
# the same shaped test hosts) and prints the figures side by side, each as a
# speed-up over the first combination: time(first) / time(this).
#
# Usage:
#   bench/compare.sh [--preset NAME]... [common options] [-- extra p2ptrain flags]
#   bench/compare.sh --hosts 4 --rate 100mbit --codec fp32 --codec int8 [--schedule ring]...
#
# Presets (the targets of issue 4; default: all three, in this order):
#   gbit     4 hosts at 1gbit, fp32, ring: busbw over the link rate (target ≥ 0.95)
#   codecs   4 hosts at 100mbit, ring: fp32 against int8, sint8, dyn8 (target ≥ 3.7),
#            onebit, sign (≥ 20) and qsgd:bits=4 (≥ 7), as time(fp32)/time(codec)
#   uneven   1 host at 100mbit + 3 at 1gbit, fp32: schedule ring against auto,
#            proportional (bandwidth shares) and ring+links (the ring with
#            --link-codecs auto: fp16 on the slow host's links); target
#            time(ring)/time(this) ≥ 1.4
#
# A custom comparison instead: --hosts, --rate or --rates, and one or more
# --codec C and --schedule S (every codec with every schedule; the first codec
# with the first schedule is the baseline; a schedule S+links adds
# --link-codecs auto to S). Codec specs may contain commas
# (qsgd:bits=4,block=512), hence one flag per codec.
#
# Common options: --size [64MiB] --rounds [5] --delay --loss --mtu --queue --cc --shaper --open --timeout
# --gloo (after each run, PyTorch's gloo all-reduce on the same hosts: netns.sh --gloo; a line
# under the row gives CPU-seconds per GB all-reduced per process of both, and busbw of both, each
# as p2ptrain's over gloo's; without it the line gives p2ptrain's CPU per GB alone)
# --binary PATH (default: build bin/p2ptrain once) --out FILE (every host's JSON
# line of every run, with "compare" naming the preset, appended as JSON Lines)
# --markdown FILE (the same figures as one Markdown table, overwritten: what
# the README's speed table is; scripts/readme-speed.sh puts it there).
#
# Targets are printed next to the figures ("meets" / "below"); they are not
# asserted: the exit status is 0 when every run produced its figures, 1 when
# one failed (its row says FAILED and its logs are kept), 2 on bad usage.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

presets=() codecs=() schedules=() hosts="" rate="" rates=""
size=64MiB rounds=5 binary="" out="" markdown="" common=() extra=()

usage_err() { printf 'compare: %s (see --help)\n' "$*" >&2; exit 2; }
need_arg() { if [ $# -lt 2 ] || [ -z "$2" ]; then usage_err "$1 needs a value"; fi; }
while [ $# -gt 0 ]; do
	case "$1" in
	--preset) need_arg "$@"; presets+=("$2"); shift 2 ;;
	--codec) need_arg "$@"; codecs+=("$2"); shift 2 ;;
	--schedule) need_arg "$@"; schedules+=("$2"); shift 2 ;;
	--hosts) need_arg "$@"; hosts=$2; shift 2 ;;
	--rate) need_arg "$@"; rate=$2; shift 2 ;;
	--rates) need_arg "$@"; rates=$2; shift 2 ;;
	--size) need_arg "$@"; size=$2; shift 2 ;;
	--rounds) need_arg "$@"; rounds=$2; shift 2 ;;
	--binary) need_arg "$@"; binary=$2; shift 2 ;;
	--out) need_arg "$@"; out=$2; shift 2 ;;
	--markdown) need_arg "$@"; markdown=$2; shift 2 ;;
	--delay | --loss | --mtu | --queue | --cc | --shaper | --timeout) need_arg "$@"; common+=("$1" "$2"); shift 2 ;;
	--open | --gloo) common+=("$1"); shift ;;
	-h | --help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
	--) shift; extra=("$@"); break ;;
	*) usage_err "unknown argument $1" ;;
	esac
done

if [ ${#codecs[@]} -gt 0 ] || [ ${#schedules[@]} -gt 0 ] || [ -n "$hosts$rate$rates" ]; then
	[ ${#presets[@]} = 0 ] || usage_err "give either --preset or a custom comparison, not both"
	[ ${#codecs[@]} -gt 0 ] || codecs=(fp32)
	[ ${#schedules[@]} -gt 0 ] || schedules=(ring)
	presets=(custom)
fi
[ ${#presets[@]} -gt 0 ] || presets=(gbit codecs uneven)
for p in "${presets[@]}"; do
	case "$p" in gbit | codecs | uneven | custom) ;; *) usage_err "unknown preset $p (want gbit, codecs or uneven)" ;; esac
done

if [ -z "$binary" ]; then
	echo "compare: building bin/p2ptrain" >&2
	(cd "$ROOT" && timeout 600 go build -o bin/p2ptrain ./cmd/p2ptrain) || { echo "compare: go build failed" >&2; exit 1; }
	binary=$ROOT/bin/p2ptrain
fi

if [ -n "$markdown" ]; then
	{
		printf '| hosts | codec | schedule asked → run | median | busbw / slowest link | efficiency | speed-up vs first row | target |\n'
		printf '|---|---|---|---|---|---|---|---|\n'
	} >"$markdown" || usage_err "cannot write --markdown $markdown"
fi

work=$(mktemp -d /tmp/p2pt-compare.XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=0

field() { # name file: the field of the file's first line
	sed -nE "1s/.*\"$1\"[[:space:]]*:[[:space:]]*(\"([^\"]*)\"|([-0-9.eE+]+)).*/\2\3/p" "$2"
}
# efficiency_of file median: the link-limited ideal (the largest any host
# reports: the bytes it sent at its link's goodput) over the median; "" when
# the hosts report no ideal.
efficiency_of() {
	sed -nE 's/.*"ideal_s"[[:space:]]*:[[:space:]]*([-0-9.eE+]+).*/\1/p' "$1" |
		awk -v m="$2" '$1 > x { x = $1 } END { if (x > 0 && m > 0) printf "%.2f", x / m }'
}

# target_of preset codec schedule: "<op> <value>" of the ratio column, or "".
target_of() {
	case "$1" in
	codecs)
		case "$2" in
		int8 | sint8 | dyn8) echo 3.7 ;;
		onebit | sign) echo 20 ;;
		qsgd:bits=4*) echo 7 ;;
		esac
		;;
	uneven) [ "$3" = ring ] || echo 1.4 ;;
	esac
}

# run_table preset label hosts-args...: runs every codec × schedule and prints
# the table (label names the hosts in the Markdown table).
run_table() {
	local preset=$1 label=$2 base="" n=0 c s sched ran links jl log med busbw algbw ratio tgt verdict linkrel min_bps
	shift 2
	local net=("$@")
	printf '\n== %s: %s, size %s, %s rounds %s\n' "$preset" "${net[*]}" "$size" "$rounds" "${common[*]:-}"
	printf '%-28s %-10s %10s %11s %11s %10s %10s  %s\n' codec schedule median_s algbw_gbps busbw_gbps \
		busbw/link speedup target
	min_bps=$(bench_min_bps "${net[@]}")
	for c in "${codecs[@]}"; do
		for s in "${schedules[@]}"; do
			n=$((n + 1))
			jl=$work/$preset-$n.jsonl
			log=$work/$preset-$n.log
			sched=$s links=()
			if [[ $s == *+links ]]; then # the schedule with per-link codecs
				sched=${s%+links} links=(--link-codecs auto)
			fi
			if ! "$HERE/netns.sh" "${net[@]}" --codec "$c" --schedule "$sched" --size "$size" --rounds "$rounds" \
				--binary "$binary" --out "$jl" "${common[@]}" -- "${extra[@]}" "${links[@]}" >"$log" 2>&1; then
				printf '%-28s %-10s %10s   (see %s)\n' "$c" "$s" FAILED "$log"
				[ -z "$markdown" ] || printf '| %s | %s | %s | FAILED | | | | |\n' "$label" "$c" "$s" >>"$markdown"
				label=""
				grep -E 'error:' "$log" | tail -n 2 | sed 's/^/    /'
				trap - EXIT
				failed=1
				continue
			fi
			med=$(field median_s "$jl")
			busbw=$(field busbw_gbps "$jl")
			algbw=$(field algbw_gbps "$jl")
			[ -n "$base" ] || base=$med
			ratio=$(awk -v a="$base" -v b="$med" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
			linkrel=$(awk -v g="$busbw" -v b="$min_bps" 'BEGIN { printf "%.3f", g * 1e9 / b }')
			tgt=$(target_of "$preset" "$c" "$s")
			verdict=""
			if [ -n "$tgt" ]; then
				verdict="≥ $tgt: $(awk -v r="$ratio" -v t="$tgt" 'BEGIN { print (r >= t ? "meets" : "below") }')"
			elif [ "$preset" = gbit ]; then
				verdict="busbw/link ≥ 0.95: $(awk -v r="$linkrel" 'BEGIN { print (r >= 0.95 ? "meets" : "below") }')"
			fi
			printf '%-28s %-10s %10.3f %11.4f %11.4f %10s %10s  %s\n' "$c" "$s" "$med" "$algbw" "$busbw" \
				"$linkrel" "$ratio" "$verdict"
			cpu_line "$jl" "$busbw"
			if [ -n "$markdown" ]; then
				ran=$(field schedule "$jl")
				printf '| %s | %s | %s | %.3f s | %s | %s | %s× | %s |\n' "$label" "$c" "$s → ${ran:-?}" "$med" "$linkrel" \
					"$(efficiency_of "$jl" "$med")" "$ratio" "$verdict" >>"$markdown"
				label=""
			fi
			if [ -n "$out" ]; then
				sed -E "s/\\}[[:space:]]*\$/,\"compare\":\"$preset\"}/" "$jl" >>"$out"
			fi
		done
	done
}

# cpu_line file busbw: the CPU-seconds per GB all-reduced per process (the
# mean over hosts) of p2ptrain and, when the file has gloo's lines
# ("impl":"gloo", netns.sh --gloo), of gloo, with busbw and the ratios.
cpu_line() {
	local mean='{ if (match($0, /"cpu_s_per_gb"[[:space:]]*:[[:space:]]*[-0-9.eE+]+/)) { v = substr($0, RSTART, RLENGTH); sub(/.*:[[:space:]]*/, "", v); s += v; n++ } } END { if (n > 0) printf "%.2f", s / n }'
	local p g gbus
	p=$(grep -v '"impl"' "$1" | awk "$mean")
	g=$(grep '"impl"[[:space:]]*:[[:space:]]*"gloo"' "$1" | awk "$mean")
	gbus=$(grep '"impl"[[:space:]]*:[[:space:]]*"gloo"' "$1" | head -n 1 |
		sed -nE 's/.*"busbw_gbps"[[:space:]]*:[[:space:]]*([-0-9.eE+]+).*/\1/p')
	if [ -n "$g" ] && [ -n "$gbus" ]; then
		awk -v p="$p" -v g="$g" -v b="$2" -v gb="$gbus" 'BEGIN {
			printf "    cpu_s/GB per process: p2ptrain %s, gloo %s (%.2f×); busbw gloo %.4f Gbit/s (p2ptrain %.2f× gloo'"'"'s)\n",
				p, g, (g > 0 ? p / g : 0), gb, (gb > 0 ? b / gb : 0) }'
	elif [ -n "$p" ]; then
		printf '    cpu_s/GB per daemon: %s\n' "$p"
	fi
}

# bench_min_bps netns-args...: the slowest rate among --rate/--rates, in bit/s.
bench_min_bps() {
	local r="" list
	while [ $# -gt 0 ]; do
		case "$1" in --rate | --rates) r=$2; shift 2 ;; *) shift ;; esac
	done
	[ -n "$r" ] || r=1gbit
	IFS=, read -r -a list <<<"$r"
	printf '%s\n' "${list[@]}" | awk '{
		if (!match($0, /^[0-9]+(\.[0-9]+)?/)) next
		v = substr($0, 1, RLENGTH) + 0; u = tolower(substr($0, RLENGTH + 1))
		m["bit"] = 1; m[""] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
		b = v * m[u]; if (min == "" || b < min) min = b }
		END { printf "%.0f\n", min }'
}

for p in "${presets[@]}"; do
	case "$p" in
	gbit)
		codecs=(fp32) schedules=(ring)
		run_table gbit "4 × 1 Gbit/s" --hosts 4 --rate 1gbit
		;;
	codecs)
		codecs=(fp32 int8 sint8 dyn8 onebit sign qsgd:bits=4) schedules=(ring)
		run_table codecs "4 × 100 Mbit/s" --hosts 4 --rate 100mbit
		;;
	uneven)
		codecs=(fp32) schedules=(ring auto proportional ring+links)
		run_table uneven "1 × 100 Mbit/s + 3 × 1 Gbit/s" --rates 100mbit,1gbit,1gbit,1gbit
		;;
	custom)
		net=()
		[ -z "$hosts" ] || net+=(--hosts "$hosts")
		[ -z "$rate" ] || net+=(--rate "$rate")
		[ -z "$rates" ] || net+=(--rates "$rates")
		run_table custom "${net[*]}" "${net[@]}"
		;;
	esac
done
if [ "$failed" = 1 ]; then
	echo "compare: some runs failed; their logs are kept in $work" >&2
	exit 1
fi
exit 0
