#!/usr/bin/env bash
# bench/torch-bridge.sh — the PyTorch bridge (docs/pytorch.md) against PyTorch
# DistributedDataParallel and against p2ptrain's own trainer, on N test hosts
# built from Linux network namespaces (bench/netns.sh --up) with tc-shaped links.
#
# Usage:
#   bench/torch-bridge.sh [options]
#
# Options (defaults in brackets):
#   --hosts N          test hosts, 2..16 [4]
#   --rate R           every host's link rate, tc units: 100mbit, 1gbit [100mbit]
#   --steps N          training steps of every run, at least 100 [300]
#   --batch B          samples per host per step [64]
#   --hidden H         the MLP's two hidden widths (784-H-H-10) [256]
#   --codecs LIST      p2ptrain codecs, comma-separated; a ',' inside one codec's
#                      parameters is written ';' (qsgd:bits=4;block=512)
#                      [none,sint8,qsgd:bits=4]
#   --parts LIST       which runs, comma-separated (see below): alone, ddp, bridge, go
#                      [alone,ddp,bridge,go]; alone runs only with one of the others
#   --markdown FILE    also write the table to FILE
#   --timeout S        seconds one run (all its processes) may take before it is
#                      killed and the benchmark fails [estimated from the fp32 step
#                      time at --rate: 240 + steps × (4 × that + 0.2)]
#   --wait S           when the p2pt-* namespaces exist (another run uses them), poll
#                      every 20 s for up to S seconds until they are gone [0: fail at once]
#   --logdir DIR       keep every process's stdout/stderr there (default: a temporary
#                      directory, removed after a successful run, kept after a failure)
#   -h, --help         this text
#
# Runs, one after the other, on the same hosts (bench/netns.sh --up --hosts N --rate R):
#   alone        the floor no codec can go below: on every host at once, the script as a
#                DDP world of its own (--ddp 0:1:<its address>:PORT, no all-reduce) and,
#                separately, the Go trainer as a cluster of its own (--min-peers 1): the
#                compute of N processes sharing this machine's CPUs
#   bridge C     on every host i: `p2ptrain join --trainer external --socket S --steps N
#                --codec C --min-peers N` and beside it python/examples/fashion_mnist.py
#                --socket S --batch B --hidden H --threads 1 (PYTHONPATH=python), one run
#                per codec of --codecs
#   Go C         on every host: `p2ptrain join --model mlp --steps N --codec C --min-peers N`
#                with [train] hidden = [H, H], batch_size = B, lr = 0.05, eval_every = 0,
#                eval_samples = 2000, check_every = 50 (the same MLP, batch and steps; its
#                lr has the built-in trainer's 50-step warm-up and cosine decay, the
#                script's is constant)
#   DDP fp32     on every host: fashion_mnist.py --ddp (i-1):N:10.77.0.11:PORT --steps N
#                (PyTorch DistributedDataParallel over gloo, eth0 of the host)
#   DDP fp16     the same with --ddp-fp16 (DDP's fp16_compress_hook)
# Every daemon: a shared swarm key, a persistent identity (host 1's multiaddr
# /ip4/10.77.0.11/tcp/4001/p2p/<id> is known before it starts), --listen
# /ip4/10.77.0.(10+i)/tcp/4001, --mdns=false, --api 127.0.0.1:7420 (the host's
# own loopback), --log-format json and allreduce.link_codecs = "off" (the codec
# on every link, so the bytes sent are the codec's) and allreduce.schedule =
# "ring": the links are equal, and with 8 processes on a 2-core machine the
# background link probes measure CPU as much as links, so "auto" sometimes
# read them as unequal and took proportional shares (the owner of a large
# share sends and receives more: a none step 20 % slower, varying run to run;
# DDP's gloo ring is fixed too). All traffic stays inside
# the namespaces; torch gets 1 intra-op thread per process (--threads 1,
# OMP_NUM_THREADS=1).
#
# The figures:
#   ms/step      the time of one step, measured after start-up: every run prints
#                (or logs) its progress at step 50 and at later steps, and ms/step is
#                (t(last) − t(50)) / (last − 50), "last" the highest multiple of 50 up to
#                --steps. The script's "step S ... X ms/step" lines give t(S) = S·X
#                (X is the mean since its first step); the Go trainer's JSON "progress"
#                lines give t(S) from their timestamps (ms). So connecting, waiting for
#                the peers, the first ring epoch and the warm-up of the first 50 steps are
#                left out. The figure is the median over the hosts.
#   × vs DDP fp32  ms/step of DDP fp32 / ms/step of the row: the speed-up over DDP.
#   ideal ×      for the bridge rows: the codec's compression ratio vs fp32, the
#                speed-up a purely network-bound step would get. Measured as the
#                daemons' bytes sent per step (their "progress" logs' bytes_per_step,
#                mean over steps 50..N and hosts) of codec none over that of the codec
#                when none is among --codecs; else nominal (none 1, fp16/bf16 2,
#                int8/sint8/dyn8 4, qsgd:bits=b 32/b). In brackets: how much of it
#                the row reached (× vs DDP fp32 / ideal ×); "faster than DDP fp32 by the
#                codec's ratio within 15 %" means at least 85 %. DDP fp16's is 2.
#   step / (wire + compute)  ms/step over the time of the bytes each daemon sent per
#                step (mean over hosts) at TCP's goodput on the link (0.956 of --rate)
#                plus the compute alone (PyTorch alone for the bridge, the Go trainer
#                alone for the Go rows): 1.00× is a step whose all-reduce runs at
#                the link's goodput and does not overlap compute.
#   ideal ms with compute   the same ideal with the compute no codec removes: PyTorch
#                alone's ms/step plus DDP fp32's all-reduce time (its ms/step less
#                PyTorch alone's) divided by the ratio; in brackets ideal / ms/step. A
#                step cannot beat it unless its all-reduce overlaps compute better than
#                DDP fp32's does.
#   accuracy     on the first 2000 test images after the run (every host must agree:
#                for the bridge and the Go trainer the parameter hashes of all hosts,
#                and of each script with its daemon, must be equal, or the benchmark
#                fails; DDP's ranks are only compared, with a warning).
#   bridge overhead vs Go trainer   ms/step of the bridge / ms/step of the Go trainer
#                with the same codec, as a percentage more time per step. It contains
#                PyTorch's own compute, which is not the bridge's: compare the two
#                "alone" rows (the bridge itself, one host alone, adds a few ms per step
#                to the script's step).
#   per-step split (printed for every bridge and Go run, not in the table): every
#                daemon writes a metrics file (--metrics-file), and over its step records
#                of steps 50..N the medians of step, compute and all-reduce time, then
#                the median over the hosts; "starts apart" is, per step, the latest
#                host's all-reduce start less the earliest's (the record's time less its
#                all-reduce and wait), the median over the steps: how long the earliest
#                host waits inside its all-reduce for the others to finish computing.
# On a small machine every host's processes share the same few cores: N PyTorch
# processes computing at once take longer than one alone, and that time is in every
# row that runs the script, so a codec's speed-up over DDP fp32 is bounded by
# ms/step(DDP fp32) / ms/step(PyTorch alone) whatever its ratio.
# On stderr, per run and host: ms/step, the daemon's own ms/step (from its progress
# timestamps) and bytes sent per step.
#
# Needs root, iproute2, Go, Debian's /usr/bin/python3 with torch (not the pyenv one)
# and Fashion-MNIST (/usr/share/datasets/fashion-mnist). On a machine without Go or
# Debian's packages (a GPU machine: scripts/gpu-check.sh), BINARY names a prebuilt
# p2ptrain, PYTHON another python3 with torch, and P2PTRAIN_DATA the folder of the
# Fashion-MNIST files. Exits 1 on any failure, 2 on bad usage. A trap on EXIT/INT/TERM kills every process it started and removes the
# namespaces (bench/netns.sh --cleanup), but only when this script made them: when
# p2pt-* namespaces exist at the start (another run's), it waits (--wait) or fails,
# and never touches them.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=p2pt
SUBNET=10.77.0
PORT=4001
DDP_PORT=29500
PY=${PYTHON:-/usr/bin/python3}
SCRIPT=$ROOT/python/examples/fashion_mnist.py # run with --model mlp (the shape the Go trainer has)

hosts=4 rate=100mbit steps=300 batch=64 hidden=256 codecs="none,sint8,qsgd:bits=4"
parts="alone,ddp,bridge,go" markdown="" timeout_s="" wait_s=0 logdir=""

PROG=torch-bridge
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

while [ $# -gt 0 ]; do
	case "$1" in
	--hosts) need_arg "$@"; hosts=$2; shift 2 ;;
	--rate) need_arg "$@"; rate=$2; shift 2 ;;
	--steps) need_arg "$@"; steps=$2; shift 2 ;;
	--batch) need_arg "$@"; batch=$2; shift 2 ;;
	--hidden) need_arg "$@"; hidden=$2; shift 2 ;;
	--codecs) need_arg "$@"; codecs=$2; shift 2 ;;
	--parts) need_arg "$@"; parts=$2; shift 2 ;;
	*) common_flag "$@"; shift 2 ;;
	esac
done

int_in "$hosts" 2 16 || usage_err "--hosts must be 2..16"
int_in "$steps" 100 1000000 || usage_err "--steps must be at least 100 (ms/step is measured from step 50 on)"
int_in "$batch" 1 65536 || usage_err "--batch must be a positive integer"
int_in "$hidden" 1 65536 || usage_err "--hidden must be a positive integer"
[ -z "$timeout_s" ] || int_in "$timeout_s" 10 100000 || usage_err "--timeout wants whole seconds (at least 10)"
int_in "$wait_s" 0 100000 || usage_err "--wait wants whole seconds"
rate_bps=$(awk -v r="$rate" 'BEGIN {
	if (!match(r, /^[0-9]+(\.[0-9]+)?/)) exit 1
	v = substr(r, 1, RLENGTH) + 0; u = tolower(substr(r, RLENGTH + 1))
	m["bit"] = 1; m[""] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9
	if (!(u in m) || v <= 0) exit 1
	printf "%.0f\n", v * m[u] }') || usage_err "bad --rate '$rate' (want e.g. 100mbit, 1gbit)"
IFS=, read -r -a codec_list <<<"$codecs"
[ "${#codec_list[@]}" -gt 0 ] || usage_err "--codecs is empty"
for ((k = 0; k < ${#codec_list[@]}; k++)); do
	codec_list[k]=${codec_list[k]//;/,}
	[[ "${codec_list[k]}" =~ ^[a-z0-9]+(:[a-z0-9_.=,]+)?$ ]] || usage_err "bad codec '${codec_list[k]}'"
done
do_bridge=0 do_go=0 do_ddp=0 do_alone=0
IFS=, read -r -a part_list <<<"$parts"
for p in "${part_list[@]}"; do
	case "$p" in
	bridge) do_bridge=1 ;; go) do_go=1 ;; ddp) do_ddp=1 ;; alone) do_alone=1 ;;
	*) usage_err "unknown part '$p' in --parts (bridge, go, ddp, alone)" ;;
	esac
done

# The MLP's parameters, the fp32 ring's time per step at the link rate (TCP
# payload is 0.956 of the shaped rate at MTU 1500), and from it the timeout.
params=$((784 * hidden + hidden + hidden * hidden + hidden + 10 * hidden + 10))
ring_s=$(awk -v n="$hosts" -v p="$params" -v b="$rate_bps" 'BEGIN { printf "%.4f\n", 2 * (n - 1) / n * 4 * p * 8 / (0.956 * b) }')
if [ -z "$timeout_s" ]; then
	timeout_s=$(awk -v s="$steps" -v t="$ring_s" 'BEGIN { printf "%d\n", 240 + s * (4 * t + 0.2) }')
fi
# ms/step is measured between the step-50 line and the last multiple of 50.
last_step=$((steps / 50 * 50))

[ "$(id -u)" = 0 ] || die "needs root (network namespaces, tc)"
command -v ip >/dev/null 2>&1 || die "ip (iproute2) is not on PATH"
[ -n "${BINARY:-}" ] || command -v go >/dev/null 2>&1 || die "go is not on PATH (or set BINARY to a p2ptrain binary)"
[ -x "$PY" ] || die "$PY not found (Debian's python3 with python3-torch)"
[ "$do_bridge$do_ddp" = 00 ] || "$PY" -c 'import torch' 2>/dev/null ||
	die "$PY cannot import torch (scripts/setup.sh installs python3-torch)"

# --- hosts, daemons, cleanup (bench/cluster.sh) --------------------------------------

WORK_NAME=p2pt-torch-bridge CLUSTER_TAG=torch-bench
# shellcheck source=bench/cluster.sh
. "$ROOT/bench/cluster.sh"
cluster_up --rate "$rate"
say "$hosts hosts at $rate, MLP 784-$hidden-$hidden-10 ($params parameters, fp32 ring ≈ $(awk -v t="$ring_s" 'BEGIN { printf "%.0f", t * 1000 }') ms/step at the link rate), batch $batch, $steps steps, timeout ${timeout_s}s per run; logs in $work"

# script_ms FILE: ms/step over steps 50..last from the script's "step S loss L X ms/step"
# lines (X: mean since its start, so t(S) = S·X).
script_ms() {
	awk -v a=50 -v b="$last_step" '$1 == "step" && $NF == "ms/step" {
		if ($2 == a) ta = $2 * $(NF - 1); if ($2 == b) tb = $2 * $(NF - 1) }
		END { if (ta == "" || tb == "") exit 1; printf "%.2f\n", (tb - ta) / (b - a) }' "$1"
}

# progress_ms FILE: the same from a daemon's JSON progress lines (their "ts").
progress_ms() {
	local ta tb
	ta=$(progress_ts "$1" 50)
	tb=$(progress_ts "$1" "$last_step")
	[ -n "$ta" ] && [ -n "$tb" ] || return 1
	ta=$(date -d "$ta" +%s.%N) && tb=$(date -d "$tb" +%s.%N) || return 1
	awk -v x="$ta" -v y="$tb" -v n=$((last_step - 50)) 'BEGIN { printf "%.2f\n", (y - x) * 1000 / n }'
}

# progress_bytes FILE: mean bytes_per_step of the progress lines from step 50 on.
progress_bytes() {
	grep '"msg":"progress"' "$1" | sed -nE 's/.*"step":([0-9]+),.*"bytes_per_step":([0-9.eE+-]+).*/\1 \2/p' |
		awk '$1 >= 50 { s += $2; n++ } END { if (!n) exit 1; printf "%.0f\n", s / n }'
}

# step_split PREFIX HOSTS: the per-step split of one run from the metrics files
# PREFIX-h1.metrics .. PREFIX-hHOSTS.metrics (see "per-step split" above).
step_split() {
	"$PY" - "$1" "$2" <<'PYEOF'
import json, statistics, sys
from datetime import datetime, timezone

def when(ts):
    # RFC 3339 with up to nanoseconds: Python parses only microseconds.
    base, _, frac = ts.rstrip("Z").partition(".")
    t = datetime.fromisoformat(base).replace(tzinfo=timezone.utc).timestamp()
    return t + float("0." + (frac or "0"))

prefix, hosts = sys.argv[1], int(sys.argv[2])
per_host, starts = [], {}
for h in range(1, hosts + 1):
    recs = []
    with open(f"{prefix}-h{h}.metrics") as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "step" and r.get("step", 0) >= 50:
                recs.append(r)
                starts.setdefault(r["step"], []).append(when(r["time"]) - r.get("allreduce_s", 0) - r.get("wait_s", 0))
    if not recs:
        sys.exit(1)
    per_host.append([statistics.median(r.get(k, 0) for r in recs) * 1000 for k in ("step_s", "compute_s", "allreduce_s")])
med = [statistics.median(h[i] for h in per_host) for i in range(3)]
apart = [(max(v) - min(v)) * 1000 for v in starts.values() if len(v) == hosts]
print("step %.1f ms = compute %.1f + all-reduce %.1f (+ the rest); all-reduce starts %.1f ms apart"
      % (med[0], med[1], med[2], statistics.median(apart) if apart else float("nan")))
PYEOF
}


declare -A r_ms=() r_acc=() r_bytes=() r_label=()
rows=()

write_config() { # file kind
	if [ "$2" = bridge ]; then
		printf '[train]\ntrainer = "external"\ncheck_every = 50\n[allreduce]\nlink_codecs = "off"\nschedule = "ring"\n' >"$1"
	else
		printf '[train]\nmodel = "mlp"\nhidden = [%d, %d]\nbatch_size = %d\nlr = 0.05\ntrain_samples = 0\neval_every = 0\neval_samples = 2000\ncheck_every = 50\n[allreduce]\nlink_codecs = "off"\nschedule = "ring"\n' \
			"$hidden" "$hidden" "$batch" >"$1"
	fi
}

# run_p2p KIND CODEC: the bridge (KIND bridge: a daemon and the script on every
# host) or the Go trainer (KIND go: a daemon training the MLP itself) with CODEC;
# KIND go-alone: the Go trainer on every host at once, each a cluster of its own.
run_p2p() {
	local kind=$1 codec=$2 run i t names=() ms dms bytes line dline hash acc first_hash="" s0 sock
	local host_ms=() host_bytes=() accs=()
	run="$kind-${codec//[^a-z0-9]/_}"
	[ "$kind" != go-alone ] || run=go-alone
	s0=$SECONDS
	quiesce
	write_config "$work/$run.toml" "$kind"
	say "$run: starting"
	if [ "$kind" = go-alone ]; then
		for ((i = 1; i <= hosts; i++)); do
			bg "$run-h$i-d" "$i" "$BIN" join --config "$work/$run.toml" --listen "/ip4/$(host_ip "$i")/tcp/$PORT" \
				--swarm-key "$work/swarm.key" --identity "$work/h$i.identity" --name "h$i" --cluster "torch-bench-$run-h$i" \
				--mdns=false --api 127.0.0.1:7420 --log-format json --steps "$steps" --min-peers 1 --codec "$codec"
		done
	elif [ "$kind" = bridge ]; then
		start_daemons "$run" "$work/$run.toml" --codec "$codec" --socket "$work/$run-{host}.sock" \
			--metrics-file "$work/$run-{host}.metrics"
	else
		start_daemons "$run" "$work/$run.toml" --codec "$codec" --metrics-file "$work/$run-{host}.metrics"
	fi
	for ((i = 1; i <= hosts; i++)); do names+=("$run-h$i-d"); done
	if [ "$kind" = bridge ]; then
		for ((i = 1; i <= hosts; i++)); do
			sock=$work/$run-h$i.sock
			for ((t = 0; t < 300; t++)); do
				[ -S "$sock" ] && break
				kill -0 "${pids[i - 1]}" 2>/dev/null || break
				sleep 0.2
			done
			[ -S "$sock" ] || { show_tail "$run-h$i-d"; kill_ours; die "$run: the daemon on h$i made no socket $sock"; }
			bg "$run-h$i-py" "$i" env PYTHONPATH="$ROOT/python" OMP_NUM_THREADS=1 "$PY" "$SCRIPT" \
				--socket "$sock" --model mlp --batch "$batch" --hidden "$hidden" --threads 1
			names+=("$run-h$i-py")
		done
	fi
	wait_all "${names[@]}"
	for ((i = 1; i <= hosts; i++)); do
		dline=$(grep -E '^done step=' "$work/$run-h$i-d.out" | tail -n 1 || true)
		[ -n "$dline" ] || { show_tail "$run-h$i-d"; die "$run: the daemon on h$i printed no done line"; }
		[ "$(field step "$dline")" = "$steps" ] || die "$run: h$i's daemon ended at step $(field step "$dline"), not $steps: $dline"
		hash=$(field param_hash "$dline")
		dms=$(progress_ms "$work/$run-h$i-d.err") || { show_tail "$run-h$i-d"; die "$run: no progress lines for steps 50 and $last_step in h$i's daemon log"; }
		bytes=$(progress_bytes "$work/$run-h$i-d.err") || die "$run: no bytes_per_step in h$i's daemon log"
		if [ "$kind" = bridge ]; then
			line=$(grep -E '^done step=' "$work/$run-h$i-py.out" | tail -n 1 || true)
			[ -n "$line" ] || { show_tail "$run-h$i-py"; die "$run: the script on h$i printed no done line"; }
			[ "$(field param_hash "$line")" = "$hash" ] || die "$run: h$i's script and daemon disagree: '$line' vs '$dline'"
			ms=$(script_ms "$work/$run-h$i-py.out") || { show_tail "$run-h$i-py"; die "$run: h$i's script printed no step lines for steps 50 and $last_step"; }
		else
			line=$dline
			ms=$dms
		fi
		acc=$(field accuracy "$line")
		[ -n "$acc" ] || die "$run: no accuracy in h$i's line '$line'"
		if [ -z "$first_hash" ]; then first_hash=$hash; elif [ "$hash" != "$first_hash" ] && [ "$kind" != go-alone ]; then
			die "$run: the hosts' parameters differ: h1 $first_hash, h$i $hash"
		fi
		host_ms+=("$ms")
		host_bytes+=("$bytes")
		accs+=("$acc")
		say "$run: h$i: $ms ms/step (its daemon's progress: $dms ms/step), $bytes bytes sent/step, accuracy $acc"
	done
	if [ "$kind" != go-alone ]; then
		line=$(step_split "$work/$run" "$hosts") || die "$run: the daemons' metrics files hold no step records for steps 50..$steps"
		say "$run: per-step medians over steps 50..$steps: $line"
	fi
	r_ms[$run]=$(printf '%s\n' "${host_ms[@]}" | median)
	r_bytes[$run]=$(printf '%s\n' "${host_bytes[@]}" | awk '{ s += $1 } END { printf "%.0f\n", s / NR }')
	r_acc[$run]=${accs[0]}
	case "$kind" in
	bridge) r_label[$run]="bridge, $codec" ;;
	go) r_label[$run]="Go trainer, $codec" ;;
	go-alone) r_label[$run]="Go trainer alone on each host (no all-reduce)" ;;
	esac
	rows+=("$run")
	say "$run: median ${r_ms[$run]} ms/step, accuracy ${accs[0]}, param_hash ${first_hash:0:16} on every host ($((SECONDS - s0)) s)"
}

# run_ddp fp32|fp16|alone: the script under DistributedDataParallel (gloo) on
# every host; "alone": every host a world of its own (no all-reduce), all at once.
run_ddp() {
	local prec=$1 run="ddp-$1" i names=() ms line acc host_ms=() accs=() s0 spec
	local extra=()
	s0=$SECONDS
	quiesce
	say "$run: starting"
	[ "$prec" != fp16 ] || extra+=(--ddp-fp16)
	for ((i = 1; i <= hosts; i++)); do
		case "$prec" in
		fp32) spec="$((i - 1)):$hosts:$(host_ip 1):$DDP_PORT" ;;
		fp16) spec="$((i - 1)):$hosts:$(host_ip 1):$((DDP_PORT + 1))" ;;
		alone) spec="0:1:$(host_ip "$i"):$((DDP_PORT + 2))" ;;
		esac
		bg "$run-h$i-py" "$i" env PYTHONPATH="$ROOT/python" OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 "$PY" "$SCRIPT" \
			--ddp "$spec" --steps "$steps" --model mlp --batch "$batch" --hidden "$hidden" --threads 1 "${extra[@]}"
		names+=("$run-h$i-py")
	done
	wait_all "${names[@]}"
	for ((i = 1; i <= hosts; i++)); do
		line=$(grep -E '^done step=' "$work/$run-h$i-py.out" | tail -n 1 || true)
		[ -n "$line" ] || { show_tail "$run-h$i-py"; die "$run: rank $((i - 1)) printed no done line"; }
		ms=$(script_ms "$work/$run-h$i-py.out") || die "$run: rank $((i - 1)) printed no step lines for steps 50 and $last_step"
		acc=$(field accuracy "$line")
		host_ms+=("$ms")
		accs+=("$acc")
		say "$run: h$i (rank $((i - 1))): $ms ms/step, accuracy $acc"
	done
	for acc in "${accs[@]}"; do
		[ "$acc" = "${accs[0]}" ] || say "warning: $run: the ranks' accuracies differ (${accs[*]})"
	done
	r_ms[$run]=$(printf '%s\n' "${host_ms[@]}" | median)
	r_acc[$run]=${accs[0]}
	case "$prec" in
	fp32) r_label[$run]="DDP (gloo), fp32" ;;
	fp16) r_label[$run]="DDP (gloo), fp16 hook" ;;
	alone) r_label[$run]="PyTorch alone on each host (no all-reduce)" ;;
	esac
	rows+=("$run")
	say "$run: median ${r_ms[$run]} ms/step, accuracy ${accs[0]} ($((SECONDS - s0)) s)"
}

if [ "$do_alone" = 1 ]; then
	[ "$do_bridge$do_ddp" = 00 ] || run_ddp alone
	[ "$do_go" = 0 ] || run_p2p go-alone none
fi
if [ "$do_ddp" = 1 ]; then
	run_ddp fp32
	run_ddp fp16
fi
for c in "${codec_list[@]}"; do
	[ "$do_bridge" = 0 ] || run_p2p bridge "$c"
	[ "$do_go" = 0 ] || run_p2p go "$c"
done

# --- the table -----------------------------------------------------------------------

# nominal_ratio CODEC: fp32 bits over the codec's bits per value ("" when unknown).
nominal_ratio() {
	local c=$1 bits
	case "$c" in
	none | fp32) echo 1 ;;
	fp16 | bf16) echo 2 ;;
	int8 | sint8 | dyn8) echo 4 ;;
	qsgd*)
		bits=$(sed -nE 's/.*bits=([0-9]+).*/\1/p' <<<"$c")
		awk -v b="${bits:-8}" 'BEGIN { printf "%.2f\n", 32 / b }' ;;
	*) echo "" ;;
	esac
}

fmt_x() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "—"; else printf "%.2f×\n", a / b }'; }

none_bytes=""
for run in "${rows[@]}"; do
	if [ "$run" = bridge-none ] || { [ -z "$none_bytes" ] && [ "$run" = go-none ]; }; then none_bytes=${r_bytes[$run]}; fi
done
ddp32=${r_ms[ddp-fp32]:-}
alone=${r_ms[ddp-alone]:-}

table=$work/table.md
{
	echo "| setup | ms/step | × vs DDP fp32 | ideal × (codec ratio; share reached) | ideal ms with compute (share reached) | step / (wire + compute) | accuracy | bridge overhead vs Go trainer |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|"
	for run in "${rows[@]}"; do
		ms=${r_ms[$run]}
		x=$(fmt_x "$ddp32" "$ms")
		ideal="" over="—" codec=""
		case "$run" in
		bridge-*)
			codec=${r_label[$run]#bridge, }
			if [ -n "$none_bytes" ] && [ -n "${r_bytes[$run]:-}" ]; then
				ideal=$(awk -v a="$none_bytes" -v b="${r_bytes[$run]}" 'BEGIN { printf "%.2f\n", a / b }')
			else
				ideal=$(nominal_ratio "$codec")
			fi
			go=go-${run#bridge-}
			if [ -n "${r_ms[$go]:-}" ]; then
				over=$(awk -v a="$ms" -v b="${r_ms[$go]}" 'BEGIN { printf "%+.0f %% (%.2f×)\n", (a / b - 1) * 100, a / b }')
			fi
			;;
		ddp-fp16) ideal=2 ;;
		esac
		wire="—" comp=""
		case "$run" in
		bridge-*) comp=$alone ;;
		go-alone) ;;
		go-*) comp=${r_ms[go-alone]:-} ;;
		esac
		if [ -n "$comp" ] && [ -n "${r_bytes[$run]:-}" ]; then
			wire=$(awk -v c="$comp" -v b="${r_bytes[$run]}" -v r="$rate_bps" -v m="$ms" 'BEGIN { t = c + b * 8 / (0.956 * r) * 1000; printf "%.2f× (of %.1f)\n", m / t, t }')
		fi
		withc="—"
		if [ -n "$ideal" ] && [ -n "$ddp32" ] && [ -n "$alone" ]; then
			withc=$(awk -v i="$ideal" -v d="$ddp32" -v a="$alone" -v m="$ms" 'BEGIN { t = a + (d - a) / i; printf "%.1f (%.0f %%)\n", t, t / m * 100 }')
		fi
		if [ -n "$ideal" ] && [ -n "$ddp32" ]; then
			ideal=$(awk -v i="$ideal" -v d="$ddp32" -v m="$ms" 'BEGIN { printf "%.2f× (%.0f %%)\n", i, d / m / i * 100 }')
		elif [ -n "$ideal" ]; then
			ideal=$(awk -v i="$ideal" 'BEGIN { printf "%.2f×\n", i }')
		else
			ideal="—"
		fi
		printf '| %s | %.1f | %s | %s | %s | %s | %s | %s |\n' "${r_label[$run]}" "$ms" "$x" "$ideal" "$withc" "$wire" "${r_acc[$run]}" "$over"
	done
} >"$table"

echo
echo "$hosts hosts at $rate (TCP ${CLUSTER_TCP:-unknown}), MLP 784-$hidden-$hidden-10, batch $batch per host, $steps steps; ms/step over steps 50..$last_step, median over hosts ($(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - start_s)) s)"
echo
cat "$table"
if [ -n "$markdown" ]; then
	{
		echo "$hosts hosts at $rate (TCP ${CLUSTER_TCP:-unknown}), MLP 784-$hidden-$hidden-10, batch $batch per host, $steps steps; ms/step over steps 50..$last_step, median over hosts"
		echo
		cat "$table"
	} >"$markdown"
fi
status=0
