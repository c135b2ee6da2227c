#!/usr/bin/env bash
# What 8-bit activations (train.activation_codec = dyn8) cost in held-out loss
# over a training run: 4 `p2ptrain join` processes on loopback train the same
# small gpt for the same steps from the same seed on the same data, as
#   dp        pure data parallelism, 4 peers x BATCH/2 windows
#   2x2 none  2 stages x 2 replicas, BATCH windows per pipeline in 4
#             micro-batches, activations and their gradients sent as fp32
#   2x2 dyn8  the same with dyn8 activations (a quarter of the bytes)
# so the global batch is 2 x BATCH windows in every run, and gradients are
# all-reduced as fp32 (allreduce.codec = none) in every run: only the
# activations' codec differs between the two pipelined runs. Every peer
# evaluates the held-out set (EVAL_SAMPLES windows) every EVAL_EVERY steps and
# at the end (a pipeline through its stages, with its activation codec); the
# script prints the held-out bits per byte of each run side by side at every
# evaluation, then each run's final figures, and checks that every peer of a
# run reports the same final figures bit for bit.
#
#   STEPS=300 BATCH=16 EVAL_EVERY=50 EVAL_SAMPLES=256 scripts/pipeline-codec-loss.sh
#
# The 4 peer identities are made once per invocation and every run uses them,
# so every run has the same ring order, hence the same layout and shards.
# The gpt: 2 blocks of width 64, 4 heads, 64-byte windows, vocabulary 256;
# AdamW lr 0.003, 20 warm-up steps; the first 4 MiB of the Go standard
# library's source, 5 % held out. LOGDIR=dir keeps each run's logs and
# metrics files. About 4 minutes on 2 cores at the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${STEPS:-300}"
batch="${BATCH:-16}"
every="${EVAL_EVERY:-50}"
samples="${EVAL_SAMPLES:-256}"
[ $((batch % 2)) -eq 0 ] && [ "$batch" -ge 4 ] || { echo "BATCH must be even and at least 4 (4 micro-batches)" >&2; exit 2; }
tmp="$(mktemp -d)"
work="${LOGDIR:-$tmp/logs}"
mkdir -p "$work"
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

bin="$tmp/p2ptrain"
go build -o "$bin" ./cmd/p2ptrain
for i in 0 1 2 3; do "$bin" keygen --identity "$tmp/$i.key" >/dev/null; done

# write_config FILE STAGES PER_PEER_BATCH ACT_CODEC
write_config() {
	cat >"$1" <<EOF
[train]
# what differs between the runs
pipeline_stages = $2
batch_size = $3
activation_codec = "$4"
micro_batches = 4
# the same in every run
model = "gpt"
steps = $steps
eval_every = $every
eval_samples = $samples
optimizer = "adamw"
lr = 0.003
warmup_steps = 20
data = ""
data_max_bytes = 4194304
[train.gpt]
layers = 2
d_model = 64
heads = 4
context = 64
vocab = 256
[allreduce]
codec = "none"
link_codecs = "off"
EOF
}

# run NAME STAGES PER_PEER_BATCH ACT_CODEC: 4 peers train; their stdout in
# $work/NAME-I.out, logs in NAME-I.log, records in NAME-I.jsonl.
run() {
	local name=$1 i boot="" start=$SECONDS
	write_config "$work/$name.toml" "$2" "$3" "$4"
	pids=()
	for i in 0 1 2 3; do
		local args=(join --name "peer$i" --cluster "pcl-$name" --identity "$tmp/$i.key" --config "$work/$name.toml"
			--listen /ip4/127.0.0.1/tcp/0 --api 127.0.0.1:0 --mdns=false --log-format json --min-peers 4
			--metrics-file "$work/$name-$i.jsonl")
		[ -z "$boot" ] || args+=(--bootstrap "$boot")
		"$bin" "${args[@]}" >"$work/$name-$i.out" 2>"$work/$name-$i.log" &
		pids+=("$!")
		if [ -z "$boot" ]; then
			for _ in $(seq 100); do
				boot="$(grep -m1 '/p2p/' "$work/$name-0.out" 2>/dev/null | tr -d ' ' || true)"
				[ -z "$boot" ] || break
				sleep 0.1
			done
			[ -n "$boot" ] || { echo "$name: peer0 did not start" >&2; tail -5 "$work/$name-0.log" >&2; exit 1; }
		fi
	done
	local status=0
	for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
	pids=()
	if [ "$status" -ne 0 ]; then
		echo "$name: a peer failed; the end of each log:" >&2
		tail -n 5 "$work/$name"-*.log >&2
		exit 1
	fi
	wall[$name]=$((SECONDS - start))
	# Every peer's final figures, without the parameter hash (the stages differ).
	local figures
	figures="$(sed -n 's/^done step=[0-9]* \(test_loss=.* bits_per_byte=[0-9.]*\).*/\1/p' "$work/$name"-[0-3].out | sort -u)"
	if [ "$(grep -c . <<<"$figures")" -ne 1 ]; then
		echo "$name: the peers report different final figures or none:" >&2
		grep -h '^done' "$work/$name"-[0-3].out >&2 || true
		exit 1
	fi
	final[$name]="$figures"
}

# evals NAME: "step bpb" per evaluation of peer 0.
evals() {
	sed -nE 's/.*"kind":"eval".*"step":([0-9]+).*"bits_per_byte":([0-9.eE+-]+).*/\1 \2/p' "$work/$1-0.jsonl"
}

declare -A wall=() final=()
echo "gpt 2 x 64, 64-byte windows; $steps AdamW steps, global batch $((2 * batch)) windows, fp32 gradients; held-out $samples windows"
run dp 1 $((batch / 2)) none
run none 2 "$batch" none
run dyn8 2 "$batch" dyn8

echo
echo "held-out bits per byte (every peer of a run reports the same)"
printf '%6s %10s %10s %10s %12s %10s\n' step dp "2x2 none" "2x2 dyn8" "dyn8 - none" relative
join -j1 <(evals dp | sort -k1,1) <(evals none | sort -k1,1) | join -j1 - <(evals dyn8 | sort -k1,1) | sort -n |
	awk '{ printf "%6d %10.5f %10.5f %10.5f %+12.5f %+10.1e\n", $1, $2, $3, $4, $4 - $3, ($4 - $3) / $3 }'
echo
printf '%-10s %-10s %s\n' run wall final
for r in dp none dyn8; do printf '%-10s %-10s %s\n' "$r" "${wall[$r]}s" "${final[$r]}"; done
