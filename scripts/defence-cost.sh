#!/usr/bin/env bash
# scripts/defence-cost.sh — what the per-step defences cost in step time:
# a 4-peer loopback cluster (scripts/demo.sh) trains the mlp with each
# setting below, side by side in one run, REPEATS times each; the figure is
# the median over runs of the time per step from step 50 to the last (from
# peer0's progress log lines: start-up and warm-up excluded), and the test
# accuracy at the end (1000 test samples) of the honest run.
#
#   [PEERS=4] [STEPS=300] [REPEATS=3] [CODEC=none] scripts/defence-cost.sh
#
# Settings (each a [train]/[allreduce] config):
#   baseline         ring schedule, parameter hash never checked (check_every = 0)
#   checks           + hash and finiteness check of the parameters every step
#                    (the default check_every = 50 costs 1/50 of the difference)
#   direct           the direct schedule (what robust aggregation needs), no clipping
#   centered_clip    allreduce.robust = "centered_clip" (direct schedule)
# The always-on defences (bounded buffers, epoch checks, quorum, peer
# scoring, non-finite gradient checks) are in every row.
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${STEPS:-300}" repeats="${REPEATS:-3}"
export PEERS="${PEERS:-4}" CODEC="${CODEC:-none}" MODEL=mlp
mkdir -p bin
go build -o bin/p2ptrain ./cmd/p2ptrain
export BINARY=bin/p2ptrain STEPS="$steps"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# setting NAME: the config of one row: schedule, robust and check_every.
declare -A row=(
	[baseline]="ring off 0"
	[checks]="ring off 1"
	[direct]="direct off 0"
	[centered_clip]="direct centered_clip 0"
)
order=(baseline checks direct centered_clip)
setting() {
	local schedule robust check
	read -r schedule robust check <<<"${row[$1]}"
	printf '[allreduce]\nschedule = "%s"\nrobust = "%s"\n[train]\ncheck_every = %s\n' "$schedule" "$robust" "$check"
	printf 'hidden = [256, 256]\neval_every = 0\neval_samples = 1000\n'
}
# ms_per_step LOG: time per step between the progress lines of step >= 50 and the last.
ms_per_step() {
	/usr/bin/python3 - "$1" <<'PY'
import json, sys, datetime
pts = []
for line in open(sys.argv[1]):
    if '"msg":"progress"' in line:
        m = json.loads(line)
        t = datetime.datetime.fromisoformat(m["ts"].replace("Z", "+00:00")).timestamp()
        pts.append((m["step"], t))
pts = [p for p in pts if p[0] >= 50]
(s0, t0), (s1, t1) = pts[0], pts[-1]
print(f"{(t1 - t0) / (s1 - s0) * 1000:.2f}")
PY
}
declare -A results accuracy
for r in $(seq "$repeats"); do
	for name in "${order[@]}"; do
		setting "$name" >"$tmp/$name.toml"
		LOGDIR="$tmp/$name-$r" CONFIG="$tmp/$name.toml" scripts/demo.sh >"$tmp/$name-$r.txt" 2>&1 ||
			{ echo "defence-cost: $name run $r failed:" >&2; tail -20 "$tmp/$name-$r.txt" >&2; exit 1; }
		results[$name]+="$(ms_per_step "$tmp/$name-$r/0.log") "
		accuracy[$name]+="$(sed -n 's/^done .*accuracy=\([0-9.]*\).*/\1/p' "$tmp/$name-$r/0.out") "
		echo "run $r $name: $(ms_per_step "$tmp/$name-$r/0.log") ms/step" >&2
	done
done
median() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
base=$(median "${results[baseline]}")
echo "| setting | ms/step (median of $repeats) | × baseline | test accuracy (median) |"
echo "|---|---:|---:|---:|"
for name in "${order[@]}"; do
	m=$(median "${results[$name]}")
	printf '| %s | %s | %.2f | %s |\n' "$name" "$m" "$(echo "$m / $base" | bc -l)" "$(median "${accuracy[$name]}")"
done
