#!/usr/bin/env bash
# bench/lm.sh — the language model (train.model = "gpt") on N test hosts built
# from Linux network namespaces (bench/netns.sh --up) with tc-shaped links:
# all-reduce every step against DiLoCo (train.sync_every = H,
# docs/low-communication.md), per link rate, timed to a held-out bits per byte.
#
# Usage:
#   bench/lm.sh [options]
#
# Options (defaults in brackets):
#   --hosts N          test hosts, 2..16 [4]
#   --rates LIST       link rates, comma-separated, tc units; each gets its own hosts
#                      and every run [100mbit,20mbit]
#   --steps N          inner steps of every run (a multiple of every H) [300]
#   --target BPB       the held-out bits per byte the runs are timed to [3.6]
#   --runs LIST        runs, comma-separated (see below)
#                      [step-none,step-sint8,step-qsgd4,diloco10-none,diloco10-sint8,
#                       diloco10m5-sint8,diloco50-none,diloco50-sint8,diloco50m5-sint8,
#                       stream10m5-sint8]
#   --markdown FILE    also write the tables to FILE
#   --timeout S        seconds one run (all its daemons) may take before it is killed
#                      and the benchmark fails [900]
#   --wait S           when the p2pt-* namespaces exist (another run uses them), poll
#                      every 20 s for up to S seconds until they are gone [0: fail at once]
#   --logdir DIR       keep every daemon's stdout/stderr there (default: a temporary
#                      directory, removed after a successful run, kept after a failure)
#   -h, --help         this text
#
# Every run trains the same gpt (2 blocks, d_model 96, 4 heads, 64-byte windows,
# about 0.25 M parameters; AdamW lr 0.003 with 20 warm-up steps and cosine decay
# over --steps inner steps; 8 windows per host per step) on the first 16 MiB of
# the Go standard library's source (train.data = "", data_max_bytes = 16777216;
# 5 % held out), with a daemon per host: `p2ptrain join --model gpt --codec C
# --min-peers N` and allreduce.link_codecs = "off". The runs:
#   step-C         all-reduce every step with codec C (none: fp32; sint8; qsgd4:
#                  qsgd:bits=4)
#   dilocoH-C      train.sync_every = H, the pseudo-gradient all-reduced with C, DiLoCo's
#                  outer optimizer (Nesterov, lr 0.7, momentum 0.9)
#   dilocoHmM-C    the same with outer momentum M/10 (m5: 0.5)
#   streamH[mM]-C  the same with train.outer_overlap = true
# Held-out evaluation (64 windows) every 10 inner steps (every outer step for H ≥ 10).
#
# The figures, per rate (host 1's log; every host's final parameter hash must agree
# or the benchmark fails):
#   to target      wall time from the first step to the first evaluation at or below
#                  --target bits per byte ("—": not reached within --steps)
#   × vs fp32      step-none's time to target over the row's
#   s/step         wall time per inner step over the whole run
#   bytes/step     bytes this host sent per inner step (its progress lines' bytes_per_step,
#                  over H for DiLoCo), mean over the run
#   final bpb      held-out bits per byte at the end
#   bpb at T       held-out bits per byte at the last evaluation before T, the shortest
#                  run's wall time (the final loss at equal wall time)
# The corpus's unigram entropy (what a model that ignores context reaches) is in the
# header. Needs root, iproute2 and Go. Exits 1 on any failure, 2 on bad usage; the
# namespaces and processes it made are removed on exit (bench/cluster.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=p2pt
SUBNET=10.77.0
PORT=4001

hosts=4 rates="100mbit,20mbit" steps=300 target=3.6 markdown="" timeout_s=900 wait_s=0 logdir=""
runs="step-none,step-sint8,step-qsgd4,diloco10-none,diloco10-sint8,diloco10m5-sint8,diloco50-none,diloco50-sint8,diloco50m5-sint8,stream10m5-sint8"

PROG=lm
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

while [ $# -gt 0 ]; do
	case "$1" in
	--hosts) need_arg "$@"; hosts=$2; shift 2 ;;
	--rates) need_arg "$@"; rates=$2; shift 2 ;;
	--steps) need_arg "$@"; steps=$2; shift 2 ;;
	--target) need_arg "$@"; target=$2; shift 2 ;;
	--runs) need_arg "$@"; runs=$2; shift 2 ;;
	*) common_flag "$@"; shift 2 ;;
	esac
done

int_in "$hosts" 2 16 || usage_err "--hosts must be 2..16"
int_in "$steps" 50 1000000 || usage_err "--steps must be at least 50"
int_in "$timeout_s" 10 100000 || usage_err "--timeout wants whole seconds (at least 10)"
int_in "$wait_s" 0 100000 || usage_err "--wait wants whole seconds"
[[ "$target" =~ ^[0-9]+(\.[0-9]+)?$ ]] || usage_err "--target wants bits per byte, e.g. 3.8"
IFS=, read -r -a rate_list <<<"$rates"
for r in "${rate_list[@]}"; do [[ "$r" =~ ^[0-9]+(\.[0-9]+)?[kmg]?bit$ ]] || usage_err "bad rate '$r' (want e.g. 100mbit)"; done
IFS=, read -r -a run_list <<<"$runs"
for run in "${run_list[@]}"; do
	[[ "$run" =~ ^(step|(diloco|stream)[0-9]+(m[0-9])?)-(none|sint8|qsgd4|int8|fp16)$ ]] || usage_err "bad run '$run' (step-C, dilocoH[mM]-C or streamH[mM]-C; C none, sint8, qsgd4, int8, fp16)"
	h=${run%%-*}
	h=${h%m[0-9]}
	h=${h#diloco}
	h=${h#stream}
	[ "$h" = step ] || { int_in "$h" 2 100000 && [ $((steps % h)) = 0 ]; } || usage_err "run $run: H must be at least 2 and divide --steps ($steps)"
done
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, tc)"
command -v ip >/dev/null 2>&1 || die "ip (iproute2) is not on PATH"
command -v go >/dev/null 2>&1 || die "go is not on PATH"

WORK_NAME=p2pt-lm CLUSTER_TAG=lm-bench
# shellcheck source=bench/cluster.sh
. "$ROOT/bench/cluster.sh"

# write_config FILE H OVERLAP MOMENTUM: the gpt's [train] settings for sync_every H.
write_config() {
	local every=10
	[ "$2" = 1 ] || every=$(((10 + $2 - 1) / $2))
	cat >"$1" <<EOF
[train]
model = "gpt"
optimizer = "adamw"
lr = 0.003
warmup_steps = 20
batch_size = 8
eval_every = $every
eval_samples = 64
check_every = 0
data = ""
data_max_bytes = 16777216
sync_every = $2
outer_overlap = $3
outer_momentum = $4
[train.gpt]
layers = 2
d_model = 96
heads = 4
context = 64
vocab = 256
[allreduce]
link_codecs = "off"
EOF
}

# ts_s LINE: the JSON line's "ts" in seconds since the epoch.
ts_s() { date -d "$(sed -nE 's/.*"ts":"([^"]+)".*/\1/p' <<<"$1")" +%s.%N; }

declare -A r_target=() r_sps=() r_bytes=() r_final=() r_wall=() r_curve=()
rows=()

# run_lm RATE RUN: one run on every host; records its figures.
run_lm() {
	local rate=$1 run=$2 kind codec h=1 overlap=false mom=0.9 key names=() i dline hash first_hash="" log t0 t1 line
	kind=${run%%-*} codec=${run#*-}
	if [[ "$kind" =~ m([0-9])$ ]]; then mom=0.${BASH_REMATCH[1]} kind=${kind%m[0-9]}; fi
	case "$kind" in diloco*) h=${kind#diloco} ;; stream*) h=${kind#stream} overlap=true ;; esac
	[ "$codec" != qsgd4 ] || codec="qsgd:bits=4"
	key="$rate/$run"
	quiesce
	write_config "$work/$run.toml" "$h" "$overlap" "$mom"
	say "$key: starting"
	start_daemons "$run" "$work/$run.toml" --codec "$codec"
	for ((i = 1; i <= hosts; i++)); do names+=("$run-h$i-d"); done
	wait_all "${names[@]}"
	for ((i = 1; i <= hosts; i++)); do
		dline=$(grep -E '^done step=' "$work/$run-h$i-d.out" | tail -n 1 || true)
		[ -n "$dline" ] || { show_tail "$run-h$i-d"; die "$key: h$i printed no done line"; }
		hash=$(field param_hash "$dline")
		if [ -z "$first_hash" ]; then first_hash=$hash; elif [ "$hash" != "$first_hash" ]; then
			die "$key: the hosts' parameters differ: h1 $first_hash, h$i $hash"
		fi
	done
	log=$work/$run-h1-d.err
	line=$(grep -m1 '"msg":"training in ring epoch"' "$log") || die "$key: no 'training in ring epoch' line in h1's log"
	t0=$(ts_s "$line")
	# The held-out curve: "seconds-since-t0 inner-step bpb" per evaluation.
	r_curve[$key]=$(grep '"msg":"evaluation"' "$log" | while read -r line; do
		printf '%s %s %s\n' "$(awk -v a="$(ts_s "$line")" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')" \
			"$(($(sed -nE 's/.*"step":([0-9]+).*/\1/p' <<<"$line") * h))" "$(sed -nE 's/.*"bits_per_byte":([0-9.eE+-]+).*/\1/p' <<<"$line")"
	done)
	[ -n "${r_curve[$key]}" ] || die "$key: no evaluation lines in h1's log"
	line=$(grep '"msg":"progress"' "$log" | tail -n 1)
	t1=$(ts_s "$line")
	r_wall[$key]=$(awk -v a="$t1" -v b="$t0" 'BEGIN { printf "%.1f", a - b }')
	r_sps[$key]=$(awk -v w="${r_wall[$key]}" -v n="$steps" 'BEGIN { printf "%.3f", w / n }')
	r_bytes[$key]=$(grep '"msg":"progress"' "$log" | sed -nE 's/.*"bytes_per_step":([0-9.eE+-]+).*/\1/p' |
		awk -v h="$h" '{ s += $1; n++ } END { if (!n) exit 1; printf "%.0f", s / n / h }') || die "$key: no bytes_per_step in h1's log"
	r_final[$key]=$(field bits_per_byte "$(grep -E '^done step=' "$work/$run-h1-d.out" | tail -n 1)")
	r_target[$key]=$(awk -v t="$target" '$3 <= t { print $1; found = 1; exit } END { if (!found) print "" }' <<<"${r_curve[$key]}")
	say "$key: ${r_wall[$key]} s, ${r_sps[$key]} s/step, ${r_bytes[$key]} B/step, final ${r_final[$key]} bpb, to $target bpb: ${r_target[$key]:-not reached} s"
}

table=$work/tables.md
: >"$table"
for rate in "${rate_list[@]}"; do
	cluster_up --rate "$rate"
	unigram=""
	for run in "${run_list[@]}"; do
		run_lm "$rate" "$run"
		[ -n "$unigram" ] || unigram=$(grep -m1 '"msg":"text corpus"' "$work/$run-h1-d.err" | sed -nE 's/.*"unigram_bits_per_byte":([0-9.]+).*/\1/p')
		rows+=("$rate/$run")
		mv "$work/$run.toml" "$work/$rate-$run.toml"
		for f in "$work/$run"-h*; do mv "$f" "$work/$rate-${f#"$work/"}"; done
	done
	cluster_down
	# The shortest run's wall time, for "bpb at T".
	tmin=$(for run in "${run_list[@]}"; do echo "${r_wall[$rate/$run]}"; done | sort -g | head -n 1)
	base=${r_target[$rate/step-none]:-}
	{
		printf '\n%s hosts at %s: gpt 2×96 (ctx 64), %s inner steps of 8 windows per host; target %s bits per byte (corpus unigram entropy %.2f)\n\n' \
			"$hosts" "$rate" "$steps" "$target" "${unigram:-0}"
		echo "| run | to target | × vs fp32 | s/step | bytes/step | final bpb | bpb at ${tmin} s |"
		echo "|---|---:|---:|---:|---:|---:|---:|"
		for run in "${run_list[@]}"; do
			key="$rate/$run"
			tt=${r_target[$key]:-}
			x="—"
			if [ -n "$tt" ] && [ -n "$base" ]; then x=$(awk -v a="$base" -v b="$tt" 'BEGIN { printf "%.2f×", a / b }'); fi
			at=$(awk -v t="$tmin" '$1 <= t { v = $3 } END { if (v == "") print "—"; else printf "%.3f", v }' <<<"${r_curve[$key]}")
			cell="— (not reached)"
			[ -z "$tt" ] || cell="$tt s"
			printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$run" "$cell" "$x" "${r_sps[$key]}" "${r_bytes[$key]}" "${r_final[$key]}" "$at"
		done
	} >>"$table"
done

cat "$table"
if [ -n "$markdown" ]; then cp "$table" "$markdown"; fi
status=0
