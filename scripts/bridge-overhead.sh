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
# DEVICE=cuda trains the script and the Go trainer on the GPU (scripts/gpu-check.sh);
# BINARY names a prebuilt p2ptrain (no Go needed) and PYTHON the interpreter
# (default Debian's /usr/bin/python3).
#
#   [STEPS=400] [REPEATS=3] [DEVICE=cpu] [BINARY=path] [PYTHON=python3] scripts/bridge-overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PROG=bridge-overhead
# shellcheck source=bench/lib.sh
. bench/lib.sh
steps="${STEPS:-400}" repeats="${REPEATS:-3}" device="${DEVICE:-cpu}" python="${PYTHON:-/usr/bin/python3}"
bin="${BINARY:-}"
if [ -z "$bin" ]; then
	mkdir -p bin
	go build -o bin/p2ptrain ./cmd/p2ptrain
	bin=bin/p2ptrain
fi
tmp=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$tmp"' EXIT
script=("$python" python/examples/fashion_mnist.py --model mlp --batch 64 --hidden 256 --threads 1 --device "$device")
export PYTHONPATH=python

# script_ms OUT: ms/step between step 50 and the last "step" line of the script's output.
script_ms() {
	awk '$1 == "step" { n = $2; avg = $5; if (n == 50) { a50 = avg } }
		END { printf "%.2f\n", (avg * n - a50 * 50) / (n - 50) }' "$1"
}
# go_ms LOG: the same from the Go trainer's JSON progress lines.
go_ms() {
	"$python" - "$1" <<'PY'
import json, sys, datetime
pts = [json.loads(l) for l in open(sys.argv[1]) if '"msg":"progress"' in l]
pts = [(p["step"], datetime.datetime.fromisoformat(p["ts"].replace("Z", "+00:00")).timestamp()) for p in pts if p["step"] >= 50]
print(f"{(pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) * 1000:.2f}")
PY
}
join=("$bin" join --listen /ip4/127.0.0.1/tcp/0 --api 127.0.0.1:0 --mdns=false --log-format json
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

	printf '[train]\nhidden = [256, 256]\neval_every = 0\ncheck_every = 50\ndevices = ["%s"]\n' "$device" >"$tmp/go.toml"
	"${join[@]}" --model mlp --config "$tmp/go.toml" >"$tmp/go.out" 2>"$tmp/go.log"
	go_ms_=$(go_ms "$tmp/go.log")
	ms[go]+="$go_ms_ "
	echo "run $r: local $local_ms bridge $bridge_ms go $go_ms_ ms/step" >&2
done
# shellcheck disable=SC2086 # each entry is a list of numbers
l=$(printf '%s\n' ${ms[local]} | median) b=$(printf '%s\n' ${ms[bridge]} | median) g=$(printf '%s\n' ${ms[go]} | median)
echo "| one peer on $device, MLP 784-256-256-10, batch 64 | ms/step (median of $repeats) |"
echo "|---|---:|"
echo "| PyTorch alone (plain opt.step()) | $l |"
echo "| PyTorch through the bridge | $b |"
awk -v b="$b" -v l="$l" 'BEGIN { printf "| the bridge'"'"'s own cost (bridge − alone) | %.2f (%.0f %% of the bridge'"'"'s step) |\n", b - l, (b - l) * 100 / b }'
echo "| Go trainer alone | $g |"
