# bench/lib.sh — the helpers the bench scripts share. Set PROG (the name in
# messages) before sourcing it; help prints the sourcing script's header.
say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
usage_err() { printf '%s: %s (see --help)\n' "$PROG" "$*" >&2; exit 2; }
help() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
need_arg() { if [ $# -lt 2 ] || [ -z "$2" ]; then usage_err "$1 needs a value"; fi; }
int_in() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]; } # value lo hi
# median [DECIMALS]: the median of the numbers on stdin, one per line, to DECIMALS
# places [2] (exit 1: none).
median() { sort -g | awk -v d="${1:-2}" '{ v[NR] = $1 } END { if (!NR) exit 1; m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.*f\n", d, m }'; }
# field NAME LINE: the value of NAME=value in LINE.
field() { sed -nE "s/.*[[:space:]]$1=([^[:space:]]+).*/\1/p" <<<"$2"; } # name line
# common_flag ARGS...: the flags every training bench takes (--markdown, --timeout,
# --wait, --logdir; -h/--help), setting markdown, timeout_s, wait_s or logdir from
# $2; the caller shifts 2. Anything else is a usage error.
common_flag() {
	case "$1" in
	--markdown) need_arg "$@"; markdown=$2 ;;
	--timeout) need_arg "$@"; timeout_s=$2 ;;
	--wait) need_arg "$@"; wait_s=$2 ;;
	--logdir) need_arg "$@"; logdir=$2 ;;
	-h | --help) help; exit 0 ;;
	*) usage_err "unknown argument $1" ;;
	esac
}
# Network-namespace scripts (bench/netns.sh, bench/nat.sh) define
# our_namespaces (the namespaces they own, one per line) and LOCK; then:
# kill_ns_pids NS ends every process in namespace NS (only what the script
# started runs there), teardown ends them in all its namespaces and deletes
# those, lock holds LOCK so that two runs of one script do not meet.
kill_ns_pids() {
	local ns=$1 pids t
	pids=$(ip netns pids "$ns" 2>/dev/null || true)
	[ -n "$pids" ] || return 0
	# shellcheck disable=SC2086 # one pid per word
	kill -TERM $pids 2>/dev/null || true
	for t in 1 2 3 4 5 6 7 8 9 10; do
		pids=$(ip netns pids "$ns" 2>/dev/null || true)
		[ -n "$pids" ] || return 0
		sleep 0.3
		: "$t"
	done
	# shellcheck disable=SC2086
	kill -KILL $pids 2>/dev/null || true
}
teardown() {
	local ns
	for ns in $(our_namespaces); do kill_ns_pids "$ns"; done
	for ns in $(our_namespaces); do ip netns del "$ns" 2>/dev/null || say "could not delete namespace $ns"; done
}
lock() {
	command -v flock >/dev/null 2>&1 || return 0
	mkdir -p "$(dirname "$LOCK")"
	exec 9>"$LOCK"
	flock -w 300 9 || die "another $(basename "$0") run holds $LOCK for more than 300 s"
}
# cleanup_and_exit is a script's --cleanup: it removes what earlier runs
# left (our_namespaces), says what, and exits 0.
cleanup_and_exit() {
	local left
	lock
	left=$(our_namespaces | tr '\n' ' ')
	teardown
	say "removed: ${left:-nothing}"
	exit 0
}
# remove_leftovers tears down what an earlier run of the script left.
remove_leftovers() {
	local left
	left=$(our_namespaces | tr '\n' ' ')
	[ -n "$left" ] || return 0
	say "removing leftovers of an earlier run: $left"
	teardown
}
# work_dir NAME sets work to the directory of --logdir (logdir; kept:
# keep_work=1) or to a new /tmp/NAME.XXXXXX (removed after a success:
# keep_work=0).
work_dir() {
	if [ -n "$logdir" ]; then
		mkdir -p "$logdir"
		work=$(cd "$logdir" && pwd)
		keep_work=1
	else
		work=$(mktemp -d "/tmp/$1.XXXXXX")
		keep_work=0
	fi
}
