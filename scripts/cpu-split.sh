#!/usr/bin/env bash
# scripts/cpu-split.sh — where a daemon's CPU per all-reduced byte goes, beside
# PyTorch's gloo on the same hosts. Runs bench/netns.sh --gloo REPEATS times
# (4 hosts, 1 Gbit/s, 64 MiB fp32 on the ring, a swarm key: the README's "CPU
# per byte against gloo" setting) with a CPU profile per daemon, and prints
#   - the median over the runs of p2ptrain's and gloo's CPU-seconds per GB
#     all-reduced per process (each run's figure is the mean over its hosts),
#     their ratio and the ratio of bus bandwidths; then the same from the whole
#     machine's busy CPU (/proc/stat) split over the hosts, which also counts the
#     kernel's network work that ran outside either program's time slices;
#   - p2ptrain's CPU split into parts, from the flat samples of all profiles:
#     encryption (AES-GCM of the direct links, ChaCha20-Poly1305, Poly1305,
#     XSalsa20), system calls (the
#     kernel's TCP work as seen from the daemon: sends, receives, polling),
#     memory copies (runtime.memmove: frames into and out of the muxer, the
#     secure channel and the codec), p2ptrain's own code (codecs, sums,
#     finiteness checks, the engine), the Go runtime (scheduler, GC, locks),
#     and the rest; each as a share of the samples and as CPU-s/GB (the share
#     times the measured CPU-s/GB). The benchmark's own set-up (filling its
#     buffers with random numbers, outside the timed rounds) is left out.
# Needs root (network namespaces), Go, jq and Debian's python3 with torch.
#
#   [REPEATS=3] [RATE=1gbit] [CODEC=fp32] [DAEMON_FLAGS='--config F'] scripts/cpu-split.sh [extra bench/netns.sh options]
#
# DAEMON_FLAGS go to every daemon (e.g. a config file with
# allreduce.direct_links = false, to measure the libp2p streams' path).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROG=cpu-split
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
repeats=${REPEATS:-3} rate=${RATE:-1gbit} codec=${CODEC:-fp32}
[[ $repeats =~ ^[1-9][0-9]*$ ]] || usage_err "REPEATS must be a positive integer, not '$repeats'"
tmp=$(mktemp -d /tmp/p2pt-cpusplit.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
bin=$tmp/p2ptrain
go build -C "$ROOT" -o "$bin" ./cmd/p2ptrain

pcpu=() gcpu=() pmach=() gmach=() bws=()
for ((r = 1; r <= repeats; r++)); do
	log=$tmp/run$r.log
	# shellcheck disable=SC2086 # DAEMON_FLAGS: one flag or value per word
	"$ROOT/bench/netns.sh" --hosts 4 --rate "$rate" --size 64MiB --codec "$codec" --schedule ring --rounds 5 \
		--gloo --binary "$bin" "$@" -- --cpuprofile "$tmp/cpu-$r-{host}.pprof" ${DAEMON_FLAGS:-} >"$log" 2>&1 ||
		{ tail -20 "$log" >&2; die "run $r failed (its last lines above)"; }
	ours=$(grep -m1 '^summary:' "$log") && theirs=$(grep -m1 '^gloo:' "$log") ||
		{ tail -20 "$log" >&2; die "run $r printed no summary or no gloo line (its last lines above)"; }
	pcpu+=("$(field cpu_s_per_gb "$ours")") gcpu+=("$(field cpu_s_per_gb "$theirs")") bws+=("$(field busbw_ratio "$theirs")")
	pmach+=("$(field machine_cpu_s_per_gb "$ours")") gmach+=("$(field machine_cpu_s_per_gb "$theirs")")
	say "run $r: p2ptrain ${pcpu[-1]} CPU-s/GB (machine-wide ${pmach[-1]}), gloo ${gcpu[-1]} (${gmach[-1]}), busbw ratio ${bws[-1]}"
done
p=$(printf '%s\n' "${pcpu[@]}" | median)
g=$(printf '%s\n' "${gcpu[@]}" | median)
bw=$(printf '%s\n' "${bws[@]}" | median)
pm=$(printf '%s\n' "${pmach[@]}" | median)
gm=$(printf '%s\n' "${gmach[@]}" | median)

# Flat samples per function, in milliseconds, over every daemon of every run.
go tool pprof -top -nodecount=100000 -nodefraction=0 -unit=ms "$bin" "$tmp"/cpu-*.pprof 2>/dev/null |
	awk '$1 ~ /ms$/ { v = $1; sub(/ms$/, "", v); name = $6; for (i = 7; i <= NF; i++) name = name " " $i; print v "\t" name }' >"$tmp/flat.tsv"
[[ -s $tmp/flat.tsv ]] || die "the profiles hold no samples"

echo
printf '%s, 4 × %s, 64 MiB on the ring, swarm key%s; medians of %d runs\n' "$codec" "$rate" "${DAEMON_FLAGS:+, daemons with $DAEMON_FLAGS}" "$repeats"
printf 'p2ptrain %.2f CPU-s/GB per daemon, gloo %.2f: ratio %.2f; busbw / gloo'"'"'s %.2f\n' "$p" "$g" "$(awk -v a="$p" -v b="$g" 'BEGIN { print a / b }')" "$bw"
printf 'machine-wide (the busy CPU of the whole machine over the timed rounds, split over the hosts): p2ptrain %.2f, gloo %.2f: ratio %.2f\n\n' "$pm" "$gm" "$(awk -v a="$pm" -v b="$gm" 'BEGIN { print a / b }')"
awk -F'\t' -v cpu="$p" '
	$2 ~ /clusterBench\)\.measure$|rand\/v2\.|^math\.arch(Exp|Log)$/ { setup += $1; next }
	$2 ~ /chacha20|poly1305|salsa|\/aes\/|gcmAes/ { part["encryption"] += $1 }
	$2 ~ /[Ss]yscall|runtime\.futex|epollwait|runtime\.netpoll$/ && $2 !~ /chacha/ { part["system calls"] += $1 }
	$2 == "runtime.memmove" { part["memory copies"] += $1 }
	$2 ~ /p2ptrain\/p2ptrain\// { part["p2ptrain (codecs, sums, checks, engine)"] += $1 }
	$2 ~ /^runtime\./ && $2 != "runtime.memmove" && $2 !~ /futex|netpoll/ { part["Go runtime (scheduler, GC, locks)"] += $1 }
	{ total += $1; seen[NR] = $2 }
	END {
		other = total
		for (k in part) other -= part[k]
		part["the rest (muxer, secure channel, libp2p)"] = other
		n = split("encryption|system calls|memory copies|p2ptrain (codecs, sums, checks, engine)|Go runtime (scheduler, GC, locks)|the rest (muxer, secure channel, libp2p)", order, "|")
		printf "| part of p2ptrain'"'"'s CPU | share | CPU-s/GB |\n|---|---|---|\n"
		for (i = 1; i <= n; i++) printf "| %s | %.0f %% | %.2f |\n", order[i], 100 * part[order[i]] / total, cpu * part[order[i]] / total
		printf "\n(%.1f s of samples in the parts; %.1f s of benchmark set-up left out)\n", total / 1000, setup / 1000
	}' "$tmp/flat.tsv"
