#!/usr/bin/env bash
# bench/pipeline.sh — hybrid data + pipeline parallelism (docs/pipeline.md) on
# test hosts built from Linux network namespaces (bench/netns.sh --up) with
# tc-shaped links: the projection of `p2ptrain plan` against measured step
# times (--validate), and pure data parallelism against pipelines of 2 and 4
# stages at equal wall time (--bench).
#
# Usage:
#   bench/pipeline.sh --validate [options]
#   bench/pipeline.sh --bench [options]
#
# Options (defaults in brackets; V: --validate, B: --bench):
#   --peers LIST       peer counts, comma-separated: 2, 4 or 8 [V: 4; B: 4,8]; layouts
#                      with more stages than peers are left out (2 peers: dp and s2)
#   --pin              every daemon and every layer-timing process on a CPU of its own
#                      (taskset -c): host i's daemon on CPU i−1, so that each peer
#                      computes on one core as on a cluster of one machine per peer;
#                      needs at most as many peers as this machine has CPUs (see below)
#   --gso-off          every host sends packets of one segment (ip link set eth0
#                      gso_max_segs 1), so that htb spaces a message at the link's rate
#                      as a real link does: with segmentation offload a message of up
#                      to 64 KiB after idle leaves at once and is charged afterwards
#                      (33 kB in 0.5 ms at 20 Mbit/s instead of 13.8 ms), which makes a
#                      pipeline's activations all but free on slow links; but the hosts
#                      then pay the kernel's work per 1448-byte packet, which a NIC
#                      that segments in hardware saves them
#   --shaper tbf       shape with tbf instead of htb (bench/netns.sh --shaper): tbf cuts
#                      offload packets into frames as it queues them, so messages are
#                      spaced at the rate and the hosts keep segmentation offload
#   --rates LIST       link rates, tc units, comma-separated; each gets its own hosts
#                      [V: 20mbit,100mbit; B: 20mbit,100mbit,1gbit]
#   --sizes LIST       gpt sizes, comma-separated: a (2 blocks of width 64, 0.12 M
#                      parameters) and b (4 blocks of width 128, 0.83 M); both with
#                      64-token windows and a 256-byte vocabulary [V: b; B: a,b]
#   --layouts LIST     V: layouts, comma-separated: dp (pure data parallelism), s2, s4
#                      (2 and 4 stages) [dp,s2,s4]
#   --steps N          V: steps of every run [40]
#   --warm N           V: steps left out at the start of every run [8]
#   --repeats N        V: runs of every row (the median of their figures counts) [2]
#   --wall S           B: seconds every run trains, from its first step [45]
#   --act-link-codecs LIST
#                      train.activation_link_codecs of the pipelines, comma-separated:
#                      off (every link carries dyn8), auto (each link the most exact
#                      of none, bf16 and dyn8 whose transfer hides under its stage's
#                      compute); each pipeline layout runs with each, side by side.
#                      Unless the list is just off, the table gains a column with the
#                      mode and the codecs the links carried in the last run's last
#                      step, counted over the links' directions [off]
#   --binary PATH      p2ptrain binary to run; without it bin/p2ptrain is (re)built
#   --markdown FILE    also write the table to FILE
#   --timeout S        seconds one run may take before it is killed and the benchmark
#                      fails [V: 300; B: wall + 120]
#   --wait S           when the p2pt-* namespaces exist (another run uses them), poll
#                      every 20 s for up to S seconds until they are gone [0: fail at once]
#   --logdir DIR       keep every daemon's logs and metrics files there (default: a
#                      temporary directory, removed after a successful run)
#   -h, --help         this text
#
# Every run: P hosts at one link rate, a daemon on each (`p2ptrain join --model gpt
# --min-peers P`, allreduce.link_codecs = "off" and schedule = "ring" as in
# bench/torch-bridge.sh, a metrics file per host), training the gpt with AdamW (lr 0.003,
# 20 warm-up steps) on the first 4 MiB of the Go standard library's source, a global
# batch of 8·P windows: pure data parallelism with 8 windows per peer, or S stages × P/S
# replicas with train.batch_size = 8·S windows per pipeline in M = 4 micro-batches (1F1B),
# dyn8 activations (train.activation_codec) and dyn8 gradients on the stages' rings.
# Pure data parallelism's codec: dyn8, the fastest by the projection at every rate here
# (checked in every row: the script says so if the plan prefers none).
#
# The projection: for every row, `p2ptrain plan --json` with the row's model, peers,
# batch, micro-batches and codecs, the link at TCP's goodput on it (0.956 of the tc rate,
# 1448 of 1514 bytes per full frame), the RTT measured between two hosts (a 1-byte TCP
# echo), and
# --layer-times: the per-layer times measured under the contention the run meets. The P
# daemons share this machine's 2 cores, so a peer computes several times slower than
# one process alone. The layers are timed by `p2ptrain plan --json` at the batch one peer
# runs at a time in the row (8 windows for data parallelism, a micro-batch of 8·S/M for
# S stages) while P−1 copies of it time the same layers without end, three times; the
# per-layer median of the three is what the projection gets, with the processor figures
# the same timings measure (the step of AdamW, the run's optimizer, per parameter; the
# transport per message and per byte; dyn8's and fp32's coding per value: docs/pipeline.md,
# "Projection"), also their medians. The same method applies to every row. The
# transport is measured over loopback, not through the kernel's shaping, and the
# projection over-counts the contention during a pipeline's fill and drain, when fewer
# than P processes compute. Every row also shows the projection without the processor
# terms (--cpu-costs=false), the projection of earlier versions.
# With --pin no peer shares its core with another: the timing process runs on CPU 0
# and its P−1 copies on CPUs 1..P−1, one each (so that the memory bus and the shared
# caches see the load of the run), and host i's daemon on CPU i−1; the layers are
# timed again before every run, and a row's prediction (and each of its parts) is
# the median of its runs' (the machine's other load changes from minute to minute,
# and a peer alone on its core has no slack to absorb it). That is the
# projection's own assumption (every peer has its device to itself), and a stage
# that waits in its pipeline's fill and drain lends its core to nobody. Other
# processes on the machine are not kept off those CPUs: run nothing beside it, or
# put it ahead of them (`nice -n -10 bench/pipeline.sh --pin ...`).
#
# The figures:
#   V: predicted s/step, measured s/step (the median interval between consecutive step
#      records after --warm steps, the median over the hosts, the median over
#      --repeats runs), their ratio and whether it is within 15 %; the step's two parts,
#      predicted (the plan's COMPUTE, a peer's or the simulated pipeline's, and its
#      ALLREDUCE + TIED) and measured (the step records' ComputeS and AllreduceS: the
#      medians over steps, hosts and runs; for a pipeline, AllreduceS also holds a stage's
#      wait for the others' drain before the tied exchange, so only the sum compares);
#      predicted and measured bytes per step (the busiest peer: the plan's SENT/PEER
#      against the largest of the hosts' median BytesSent per step); the prediction
#      without the processor terms and the measurement's ratio to it. The predicted
#      compute includes the optimizer's step, as the step records' ComputeS does.
#   B: measured and predicted s/step (as above, over the whole run after 5 steps), the
#      bytes the busiest peer sent per step, the steps done in --wall seconds, and the
#      training loss at the end of --wall: the mean over the hosts of each host's mean
#      step loss over its last 10 steps before the deadline (every peer of a pipeline
#      reports its pipeline's loss).
# --validate takes about 10 minutes, --bench about 40 (its 36 runs of --wall seconds).
# Needs root, iproute2, Go, jq and python3. Exits 1 on any failure, 2 on bad usage; the
# namespaces and processes it made are removed on exit (bench/cluster.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=p2pt
SUBNET=10.77.0
PORT=4001

BINARY="" mode="" peers_opt="" pin=0 gso_off=0 shaper=htb lt_tag="" rates="" sizes="" layouts="dp,s2,s4" steps=40 warm=8 repeats=2 wall=45
markdown="" timeout_s="" wait_s=0 logdir="" act_links=off
MICRO=4 PER_PEER=8

PROG=pipeline
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

while [ $# -gt 0 ]; do
	case "$1" in
	--validate) mode=validate; shift ;;
	--bench) mode=bench; shift ;;
	--peers) need_arg "$@"; peers_opt=$2; shift 2 ;;
	--rates) need_arg "$@"; rates=$2; shift 2 ;;
	--sizes) need_arg "$@"; sizes=$2; shift 2 ;;
	--layouts) need_arg "$@"; layouts=$2; shift 2 ;;
	--steps) need_arg "$@"; steps=$2; shift 2 ;;
	--warm) need_arg "$@"; warm=$2; shift 2 ;;
	--repeats) need_arg "$@"; repeats=$2; shift 2 ;;
	--wall) need_arg "$@"; wall=$2; shift 2 ;;
	--binary) need_arg "$@"; BINARY=$2; shift 2 ;;
	--pin) pin=1; shift ;;
	--gso-off) gso_off=1; shift ;;
	--shaper) need_arg "$@"; shaper=$2; shift 2 ;;
	--act-link-codecs) need_arg "$@"; act_links=$2; shift 2 ;;
	*) common_flag "$@"; shift 2 ;;
	esac
done

case "$mode" in
validate) : "${peers_opt:=4}" "${rates:=20mbit,100mbit}" "${sizes:=b}" "${timeout_s:=300}" ;;
bench) : "${peers_opt:=4,8}" "${rates:=20mbit,100mbit,1gbit}" "${sizes:=a,b}" "${timeout_s:=$((wall + 120))}" layouts=dp,s2,s4 ;;
*) usage_err "say --validate or --bench" ;;
esac
IFS=, read -r -a peer_list <<<"$peers_opt"
for p in "${peer_list[@]}"; do [[ "$p" =~ ^[248]$ ]] || usage_err "--peers: $p is not 2, 4 or 8"; done
if [ "$pin" = 1 ]; then
	for p in "${peer_list[@]}"; do
		[ "$p" -le "$(nproc)" ] || usage_err "--pin: $p peers need $p CPUs, this machine has $(nproc)"
	done
fi
IFS=, read -r -a rate_list <<<"$rates"
for r in "${rate_list[@]}"; do [[ "$r" =~ ^[0-9]+[kmg]bit$ ]] || usage_err "bad rate '$r' (want e.g. 100mbit)"; done
IFS=, read -r -a size_list <<<"$sizes"
for s in "${size_list[@]}"; do [[ "$s" =~ ^[ab]$ ]] || usage_err "bad size '$s' (a or b)"; done
IFS=, read -r -a layout_list <<<"$layouts"
for l in "${layout_list[@]}"; do [[ "$l" =~ ^(dp|s2|s4)$ ]] || usage_err "bad layout '$l' (dp, s2 or s4)"; done
IFS=, read -r -a act_list <<<"$act_links"
for a in "${act_list[@]}"; do [[ "$a" =~ ^(off|auto)$ ]] || usage_err "--act-link-codecs: bad mode '$a' (off or auto)"; done
act_col=0
[ "$act_links" = off ] || act_col=1
int_in "$steps" 10 100000 || usage_err "--steps must be at least 10"
int_in "$warm" 1 $((steps - 5)) || usage_err "--warm must be at least 1 and leave 5 steps"
int_in "$repeats" 1 20 || usage_err "--repeats must be 1..20"
int_in "$wall" 10 3600 || usage_err "--wall must be 10..3600 seconds"
int_in "$timeout_s" 10 100000 || usage_err "--timeout wants whole seconds (at least 10)"
int_in "$wait_s" 0 100000 || usage_err "--wait wants whole seconds"
[ -z "$BINARY" ] || [ -x "$BINARY" ] || usage_err "--binary: $BINARY is not an executable"
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, tc)"
for c in ip go jq python3; do command -v "$c" >/dev/null 2>&1 || die "$c is not on PATH"; done

hosts=${peer_list[0]}
WORK_NAME=p2pt-pipeline CLUSTER_TAG=pipe-bench
# shellcheck source=bench/cluster.sh
. "$ROOT/bench/cluster.sh"
[ "$mode" = validate ] || steps=1000000 # a bench run stops at its deadline

# gpt_shape SIZE: "layers d_model heads" of a size.
gpt_shape() { case "$1" in a) echo "2 64 2" ;; b) echo "4 128 4" ;; esac; }
plan_model() { # SIZE: p2ptrain plan's flags for it
	local l d h
	read -r l d h <<<"$(gpt_shape "$1")"
	echo "--preset tiny --gpt-layers $l --gpt-d-model $d --gpt-heads $h --gpt-context 64 --gpt-vocab 256"
}
stages_of() { case "$1" in dp) echo 1 ;; s2) echo 2 ;; s4) echo 4 ;; esac; }
# kbit RATE: a tc rate in kbit/s.
kbit() { awk -v r="$1" 'BEGIN { n = r + 0; u = substr(r, length(n "") + 1, 1); print n * (u == "g" ? 1e6 : u == "m" ? 1e3 : 1) }'; }

# stop_burners PID...: ends the timeouts PID and the plans under them (p2ptrain
# takes SIGTERM as a request to stop, which a plan timing its layers does not
# check, so SIGKILL).
stop_burners() {
	local t
	for t in "$@"; do pkill -KILL -P "$t" 2>/dev/null || true; done
	for t in "$@"; do wait "$t" 2>/dev/null || true; done
}

# on_cpu K: the words that run a command on CPU K alone with --pin ("taskset -c
# K", which execs the command: a parent that kills its child kills the command),
# none without.
on_cpu() { [ "$pin" = 0 ] || echo "taskset -c $1"; }

# layer_times SIZE P N: the file of per-layer times of SIZE at N samples, timed
# while P−1 other processes time the same layers without end (so that P processes
# compute throughout the measurement, as P peers do; with --pin the timing on CPU
# 0, the others on CPUs 1..P−1); the per-layer median over 3 timings; cached per
# run of the script, and per run of a row with --pin (lt_tag names it).
layer_times() {
	local size=$1 p=$2 n=$3 f="$work/layers-$1-p$2-n$3$lt_tag.json" i burn=() flags beside
	[ -s "$f" ] && { echo "$f"; return; }
	flags="$(plan_model "$size") --peers $p --batch $((PER_PEER * p)) --micro $MICRO --time-batch $n --optimizer adamw --json"
	for ((i = 1; i < p; i++)); do
		# shellcheck disable=SC2086 # flags are words
		timeout 300 $(on_cpu "$i") "$BIN" plan $flags --cpu-costs=false --reps 1000000 >/dev/null 2>&1 &
		burn+=($!)
	done
	sleep 1 # the burners build their models and start timing
	for i in 1 2 3; do
		# shellcheck disable=SC2086
		$(on_cpu 0) "$BIN" plan $flags --reps 9 >"$f.$i" 2>"$f.$i.err" || { stop_burners "${burn[@]}"; die "p2ptrain plan (layer timing of size $size at $n samples) failed: $(cat "$f.$i.err")"; }
	done
	stop_burners "${burn[@]}"
	beside="beside $((p - 1)) processes timing the same layers"
	[ "$pin" = 0 ] || beside="on CPU 0 alone, $beside on CPUs of their own"
	jq -s 'def med(f): [.[] | f] | sort | .[length / 2 | floor];
		. as $r | .[0] + {device: (.[0].device + " " + $beside), layers: [range(.[0].layers | length) as $k |
		.[0].layers[$k] + {forward_s_per_sample: med(.layers[$k].forward_s_per_sample),
		backward_s_per_sample: med(.layers[$k].backward_s_per_sample)}],
		cpu: (.[0].cpu + {update_s_per_param: med(.cpu.update_s_per_param), message_s: med(.cpu.message_s), byte_s: med(.cpu.byte_s),
		code_s_per_value: (.[0].cpu.code_s_per_value | with_entries(.key as $c | .value = ($r | med(.cpu.code_s_per_value[$c]))))})}' \
		--arg beside "$beside" "$f".[0-9] >"$f" ||
		die "combining the layer times of $f failed"
	echo "$f"
}

# predict P RATE SIZE LAYOUT: "step_s peer_bytes compute_s comm_s bare_step_s"
# projected for the row (compute: a peer's or the pipeline's, and the optimizer's
# step; comm: the all-reduce and the tied table after it; bare: the step without
# the processor terms, --cpu-costs=false).
predict() {
	local p=$1 rate=$2 size=$3 lay=$4 s n lt out bare flags
	s=$(stages_of "$lay")
	if [ "$s" = 1 ]; then n=$PER_PEER; else n=$((PER_PEER * s / MICRO)); fi
	lt=$(layer_times "$size" "$p" "$n")
	flags="$(plan_model "$size") --peers $p --batch $((PER_PEER * p)) --micro $MICRO --optimizer adamw
		--link $(awk -v k="$(kbit "$rate")" 'BEGIN { printf "%.0fkbit", k * 1448 / 1514 }') --rtt ${rtt_us}us
		--grad-codecs none,dyn8 --act-codecs dyn8 --layer-times $lt --json"
	# shellcheck disable=SC2086 # flags are words
	out=$("$BIN" plan $flags) || die "p2ptrain plan failed for $p $rate $size $lay"
	# shellcheck disable=SC2086
	bare=$("$BIN" plan $flags --cpu-costs=false) || die "p2ptrain plan --cpu-costs=false failed for $p $rate $size $lay"
	if [ "$s" = 1 ]; then
		# Pure data parallelism runs dyn8: it must be the plan's fastest codec.
		[ "$(jq -r '[.layouts[] | select(.stages == 1)][0].grad_codec | startswith("dyn8")' <<<"$out")" = true ] ||
			say "$p peers $rate size $size: the plan prefers another gradient codec than dyn8 for pure data parallelism"
	fi
	jq -r --argjson s "$s" --argjson bare "$bare" 'def row: [.layouts[] | select(.stages == $s and ((.grad_codec // "dyn8") | startswith("dyn8")))][0];
		row | "\(.step_s) \(.peer_bytes) \(.compute_s + .update_s) \(.allreduce_s + .tied_s) \($bare | row | .step_s)"' <<<"$out"
}

# summarize WARM DEADLINE FILES...: from the hosts' metrics files, "interval_s
# bytes_max loss steps compute_s comm_s": the median over the hosts of the
# median interval between step records after WARM steps (and, with DEADLINE >
# 0, before DEADLINE seconds from the first step record of any host), the
# largest of the hosts' median bytes per step, the mean over the hosts of the
# mean loss of their last 10 steps before the deadline, the steps host 1
# completed, and the median over the hosts of their median ComputeS and
# AllreduceS (the step's compute, or a pipeline's part, and the communication
# after it).
summarize() {
	python3 - "$@" <<'EOF'
import json, re, sys, statistics
from datetime import datetime
warm, deadline, files = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
def ts(s):
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?$", s)
    if not m:
        sys.exit("bad time %r" % s)
    tz = "+00:00" if m[3] in (None, "Z") else m[3]
    return datetime.fromisoformat(m[1] + tz).timestamp() + float(m[2] or 0)
hosts = []
for f in files:
    steps = {}
    for line in open(f):
        r = json.loads(line)
        if r.get("kind") == "step":
            steps[r["step"]] = (ts(r["time"]), r.get("bytes_sent", 0.0), r.get("loss", 0.0), r.get("compute_s", 0.0), r.get("allreduce_s", 0.0))
    hosts.append(sorted(steps.items()))
if any(len(h) < warm + 3 for h in hosts):
    sys.exit("fewer than %d step records on a host: %s" % (warm + 3, [len(h) for h in hosts]))
t0 = min(h[0][1][0] for h in hosts)
ivs, byts, losses, comp, comm = [], [], [], [], []
for h in hosts:
    keep = [(s, v) for s, v in h if deadline <= 0 or v[0] - t0 <= deadline]
    iv = [b[1][0] - a[1][0] for a, b in zip(keep, keep[1:]) if a[0] >= warm and b[0] == a[0] + 1]
    if len(iv) < 2:
        sys.exit("fewer than 2 step intervals after %d warm-up steps" % warm)
    ivs.append(statistics.median(iv))
    byts.append(statistics.median(v[1] for s, v in keep if s > warm))
    comp.append(statistics.median(v[3] for s, v in keep if s > warm))
    comm.append(statistics.median(v[4] for s, v in keep if s > warm))
    losses.append(statistics.mean(v[2] for s, v in keep[-10:]))
print("%.4f %.0f %.4f %d %.4f %.4f" % (statistics.median(ivs), max(byts), statistics.mean(losses),
      len([1 for s, v in hosts[0] if deadline <= 0 or v[0] - t0 <= deadline]), statistics.median(comp), statistics.median(comm)))
EOF
}

# write_config FILE SIZE LAYOUT: the run's settings.
write_config() {
	local l d h s
	read -r l d h <<<"$(gpt_shape "$2")"
	s=$(stages_of "$3")
	cat >"$1" <<EOF
[train]
model = "gpt"
optimizer = "adamw"
lr = 0.003
warmup_steps = 20
batch_size = $((PER_PEER * s))
eval_every = 0
eval_samples = 64
check_every = 0
data = ""
data_max_bytes = 4194304
[train.gpt]
layers = $l
d_model = $d
heads = $h
context = 64
vocab = 256
[allreduce]
link_codecs = "off"
schedule = "ring"
EOF
}

# run_one RUN SIZE LAYOUT: one run on every host; sets line to summarize's
# line ("nan nan nan 0 nan nan" when a bench run has too few steps to summarize).
run_one() {
	local run=$1 size=$2 lay=$3 s i names=() t files=() deadline=0 t_start
	s=$(stages_of "$lay")
	quiesce
	write_config "$work/$run.toml" "$size" "$lay"
	local extra=(--codec dyn8 --metrics-file "$work/$run-{host}.jsonl")
	[ "$s" = 1 ] || extra+=(--set "train.pipeline_stages=$s" --set "train.micro_batches=$MICRO" --set train.activation_codec=dyn8
		--set "train.activation_link_codecs=$act")
	start_daemons "$run" "$work/$run.toml" "${extra[@]}"
	for ((i = 1; i <= hosts; i++)); do names+=("$run-h$i-d"); files+=("$work/$run-h$i.jsonl"); done
	if [ "$mode" = validate ]; then
		wait_all "${names[@]}"
		line=$(summarize "$warm" 0 "${files[@]}") || die "$run: no usable step records (logs in $work)"
		return
	fi
	# --bench: train until --wall seconds after host 1's first step, then stop.
	t_start=$SECONDS
	while :; do
		for ((i = 0; i < hosts; i++)); do
			kill -0 "${pids[i]}" 2>/dev/null || { show_tail "${names[i]}"; die "$run: ${names[i]} exited before the deadline"; }
		done
		[ $((SECONDS - t_start)) -lt "$timeout_s" ] || die "$run: no deadline reached within ${timeout_s}s"
		if [ "$deadline" = 0 ] && grep -q '"kind":"step"' "${files[0]}" 2>/dev/null; then deadline=$((SECONDS + wall + 1)); fi
		[ "$deadline" = 0 ] || [ "$SECONDS" -lt "$deadline" ] || break
		sleep 0.5
	done
	kill_ours
	line=$(summarize 5 "$wall" "${files[@]}") || { say "$run: too few steps to summarize"; line="nan nan nan 0 nan nan"; }
}

# link_codecs RUN: the codecs the pipeline links of RUN carried in each host's last
# logged choice (train.activation_link_codecs = "auto"), counted: "none×2 dyn8×2";
# "-" for pure data parallelism or none logged.
link_codecs() {
	local run=$1 i out
	out=$(for ((i = 1; i <= hosts; i++)); do
		jq -r 'select(.msg == "pipeline link codecs") | [.activations_to_next, .gradients_to_previous] | map(select(. != "")) | join(" ")' \
			"$work/$run-h$i-d.err" 2>/dev/null | tail -n 1 | tr ' ' '\n'
	done | sed 's/:.*//' | grep . | sort | uniq -c | awk '{ printf "%s%s×%d", (NR > 1 ? " " : ""), $2, $1 }')
	echo "${out:--}"
}

# mid K LINE...: the median of field K of the lines.
mid() {
	local k=$1
	shift
	printf '%s\n' "$@" | awk -v k="$k" '{ print $k }' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# measure_rtt: the median round trip of a 1-byte TCP message between host 1 and
# host 2 in microseconds (50 round trips; no ping on every machine).
measure_rtt() {
	local srv
	ip netns exec "$(host_ns 2)" timeout 30 python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 4999)); s.listen(1)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (b := c.recv(1)):
    c.sendall(b)' "$(host_ip 2)" &
	srv=$!
	ip netns exec "$(host_ns 1)" timeout 20 python3 -c '
import socket, statistics, sys, time
for _ in range(100):
    try:
        c = socket.create_connection((sys.argv[1], 4999)); break
    except OSError:
        time.sleep(0.05)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rt = []
for _ in range(50):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(1); rt.append(time.perf_counter() - t)
print(round(statistics.median(rt) * 1e6))' "$(host_ip 2)"
	kill "$srv" 2>/dev/null || true
	wait "$srv" 2>/dev/null || true
}

table=$work/table.md
: >"$table"
if [ "$mode" = validate ]; then
	echo "| peers | link | gpt | layout | predicted s/step | measured s/step | measured / predicted | within 15 % | predicted compute + comm | measured compute + comm | predicted bytes/step | measured bytes/step | without processor terms: predicted, measured / predicted |" >>"$table"
	echo "|---:|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|" >>"$table"
	[ "$act_col" = 0 ] || sed -i '1 s/$/ activation link codecs (last step) |/; 2 s/$/---|/' "$table"
else
	echo "| peers | link | gpt | layout | s/step | predicted s/step | bytes/step (busiest peer) | steps in ${wall} s | loss at ${wall} s |" >>"$table"
	echo "|---:|---|---|---|---:|---:|---:|---:|---:|" >>"$table"
	[ "$act_col" = 0 ] || sed -i '1 s/$/ activation link codecs (last step) |/; 2 s/$/---|/' "$table"
fi
for hosts in "${peer_list[@]}"; do
	DAEMON_CPUS=()
	[ "$pin" = 0 ] || mapfile -t DAEMON_CPUS < <(seq 0 $((hosts - 1)))
	for rate in "${rate_list[@]}"; do
		cluster_up --rate "$rate" --shaper "$shaper"
		if [ "$gso_off" = 1 ]; then
			for ((i = 1; i <= hosts; i++)); do
				ip netns exec "$(host_ns "$i")" ip link set dev eth0 gso_max_segs 1 || die "gso_max_segs 1 on $(host_ns "$i")'s eth0 failed"
			done
		fi
		rtt_us=$(measure_rtt) || die "measuring the RTT between h1 and h2 failed"
		say "$hosts hosts at $rate: RTT ${rtt_us} us"
		for size in "${size_list[@]}"; do
			for lay in "${layout_list[@]}"; do
				s=$(stages_of "$lay")
				[ "$s" -le "$hosts" ] || { say "$hosts hosts: no $s stages (more stages than peers)"; continue; }
				[ "$pin" = 1 ] || read -r pred pbytes pcomp pcomm pbare <<<"$(predict "$hosts" "$rate" "$size" "$lay")"
				name=$([ "$s" = 1 ] && echo "dp×$hosts" || echo "$s×$((hosts / s))")
				acts=("${act_list[@]}")
				[ "$s" != 1 ] || acts=(off)
				for act in "${acts[@]}"; do
					runs=$repeats
					[ "$mode" = validate ] || runs=1
					res=() preds=()
					for ((k = 1; k <= runs; k++)); do
						run="p$hosts-$rate-$size-$lay-$act-$k"
						if [ "$pin" = 1 ]; then # the layers timed again just before the run
							lt_tag=-$run
							preds+=("$(predict "$hosts" "$rate" "$size" "$lay")")
							read -r pred _ <<<"${preds[k - 1]}"
						fi
						say "$run: starting (predicted $pred s/step; load average $(cut -d ' ' -f 1-3 /proc/loadavg))"
						run_one "$run" "$size" "$lay"
						say "$run: interval_s bytes loss steps = $line"
						res+=("$line")
						codecs=$(link_codecs "$run")
					done
					if [ "$pin" = 1 ]; then
						pred=$(mid 1 "${preds[@]}") pbytes=$(mid 2 "${preds[@]}") pcomp=$(mid 3 "${preds[@]}") pcomm=$(mid 4 "${preds[@]}") pbare=$(mid 5 "${preds[@]}")
					fi
					meas=$(mid 1 "${res[@]}")
					mbytes=$(mid 2 "${res[@]}")
					mcomp=$(mid 5 "${res[@]}")
					mcomm=$(mid 6 "${res[@]}")
					if [ "$mode" = validate ]; then
						awk -v p="$hosts" -v r="$rate" -v g="$size" -v l="$name" -v a="$pred" -v m="$meas" -v pb="$pbytes" -v mb="$mbytes" -v n="$runs" \
							-v pc="$pcomp" -v pm="$pcomm" -v mc="$mcomp" -v mm="$mcomm" -v b="$pbare" 'BEGIN {
							q = m / a; ok = (q >= 0.85 && q <= 1.15) ? "yes" : "**no**"
							printf "| %d | %s | %s | %s | %.3f | %.3f (%d runs) | %.2f | %s | %.3f + %.3f | %.3f + %.3f | %.0f kB | %.0f kB | %.3f, %.2f |\n",
								p, r, g, l, a, m, n, q, ok, pc, pm, mc, mm, pb / 1e3, mb / 1e3, b, m / b }' >>"$table"
					else
						read -r _ _ loss nsteps <<<"${res[0]}"
						awk -v p="$hosts" -v r="$rate" -v g="$size" -v l="$name" -v a="$pred" -v m="$meas" -v mb="$mbytes" -v lo="$loss" -v n="$nsteps" 'BEGIN {
							printf "| %d | %s | %s | %s | %.3f | %.3f | %.0f kB | %d | %.3f |\n", p, r, g, l, m, a, mb / 1e3, n, lo }' >>"$table"
					fi
					[ "$act_col" = 0 ] || sed -i "\$ s/\$/ $act: $codecs |/" "$table"
					tail -n 1 "$table" >&2
				done
			done
		done
		cluster_down
	done
done

cat "$table"
if [ -n "$markdown" ]; then cp "$table" "$markdown"; fi
status=0
