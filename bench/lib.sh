# bench/lib.sh — the helpers the bench scripts share. Set PROG (the name in
# messages) before sourcing it; help prints the sourcing script's header.
say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
usage_err() { printf '%s: %s (see --help)\n' "$PROG" "$*" >&2; exit 2; }
help() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
need_arg() { if [ $# -lt 2 ] || [ -z "$2" ]; then usage_err "$1 needs a value"; fi; }
int_in() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]; } # value lo hi
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
