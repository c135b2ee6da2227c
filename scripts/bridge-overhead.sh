#!/usr/bin/env bash
# scripts/bridge-overhead.sh — the PyTorch bridge's own cost per step, apart
# from the network and from the model's compute: on one machine, with one
# peer (so the all-reduce is local), the example script
# (python/examples/fashion_mnist.py, MLP 784-256-256-10, batch 64, one torch
# thread) trains
#   local    alone with a plain opt.step()            (its compute)
#   bridge   through a daemon, --trainer external     (compute + the bridge)
# and the Go trainer trains the same MLP alone (--model mlp, hidden 256,256),
# side by side, REPEATS times each. Figures: median ms/step over steps 50..STEPS
# (from the script's cumulative "ms/step" lines at step 50 and at the end, or
# the Go trainer's progress log), and bridge − local = the bridge's own cost.
#
#   [STEPS=400] [REPEATS=3] scripts/bridge-overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${STEPS:-400}" repeats="${REPEATS:-3}"
mkdir -p bin
go build -o bin/p2ptrain ./cmd/p2ptrain
tmp=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$tmp"' EXIT
script=(/usr/bin/python3 python/examples/fashion_mnist.py --model mlp --batch 64 --hidden 256 --threads 1)
export PYTHONPATH=python

# script_ms OUT: ms/step between step 50 and the last "step" line of the script's output.
script_ms() {
	awk '$1 == "step" { n = $2; avg = $5; if (n == 50) { a50 = avg } }
		END { printf "%.2f\n", (avg * n - a50 * 50) / (n - 50) }' "$1"
}
# go_ms LOG: the same from the Go trainer's JSON progress lines.
go_ms() {
	/usr/bin/python3 - "$1" <<'PY'
import json, sys, datetime
pts = [json.loads(l) for l in open(sys.argv[1]) if '"msg":"progress"' in l]
pts = [(p["step"], datetime.datetime.fromisoformat(p["ts"].replace("Z", "+00:00")).timestamp()) for p in pts if p["step"] >= 50]
print(f"{(pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) * 1000:.2f}")
PY
}
join=(bin/p2ptrain join --listen /ip4/127.0.0.1/tcp/0 --api 127.0.0.1:0 --mdns=false --log-format json
	--steps "$steps" --min-peers 1 --cluster overhead)
declare -A ms
for r in $(seq "$repeats"); do
	"${script[@]}" --local --steps "$steps" >"$tmp/local.out"
	local_ms=$(script_ms "$tmp/local.out")
	ms[local]+="$local_ms "

	"${join[@]}" --trainer external --socket "$tmp/d.sock" >"$tmp/d.out" 2>"$tmp/d.log" &
	pids=($!)
	for _ in $(seq 100); do [ -S "$tmp/d.sock" ] && break; sleep 0.1; done
	"${script[@]}" --socket "$tmp/d.sock" >"$tmp/bridge.out"
	wait "${pids[0]}"
	bridge_ms=$(script_ms "$tmp/bridge.out")
	ms[bridge]+="$bridge_ms "

	printf '[train]\nhidden = [256, 256]\neval_every = 0\ncheck_every = 50\n' >"$tmp/go.toml"
	"${join[@]}" --model mlp --config "$tmp/go.toml" >"$tmp/go.out" 2>"$tmp/go.log"
	go_ms_=$(go_ms "$tmp/go.log")
	ms[go]+="$go_ms_ "
	echo "run $r: local $local_ms bridge $bridge_ms go $go_ms_ ms/step" >&2
done
median() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
l=$(median "${ms[local]}") b=$(median "${ms[bridge]}") g=$(median "${ms[go]}")
echo "| one peer, MLP 784-256-256-10, batch 64 | ms/step (median of $repeats) |"
echo "|---|---:|"
echo "| PyTorch alone (plain opt.step()) | $l |"
echo "| PyTorch through the bridge | $b |"
printf '| the bridge'"'"'s own cost (bridge − alone) | %.2f (%.0f %% of the bridge'"'"'s step) |\n' "$(echo "$b - $l" | bc -l)" "$(echo "($b - $l) * 100 / $b" | bc -l)"
echo "| Go trainer alone | $g |"
