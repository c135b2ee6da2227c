#!/usr/bin/env bash
# bench/nat.sh — peers behind NAT: two private subnets behind two NAT routers
# (network namespaces with iptables MASQUERADE) and one public peer between
# them; the three train together and must end with identical parameters.
#
# Usage:
#   bench/nat.sh [options]        run the cases (both by default), print the figures
#   bench/nat.sh --cleanup        remove what an earlier (crashed) run left
#
# Options (defaults in brackets):
#   --case a|b|both    a: NATs with endpoint-independent mapping (plain MASQUERADE,
#                      which keeps the source port when it is free): the peers behind
#                      them meet through the public peer's relay, then DCUtR hole
#                      punching must give them a direct connection. b: NATs that
#                      defeat hole punching (MASQUERADE --random-fully: a new port for
#                      every connection): they stay relayed and must still finish.
#                      [both]
#   --steps N          training steps [300, about 40 s: the run outlasts a peer's
#                      retry of a hole punch that did not happen, 15 s after it could
#                      have, and the punch after it]
#   --reachability R   node.reachability of the peers behind NAT: auto (AutoNAT
#                      finds out, which takes its 15 s boot delay and a failed
#                      dial-back; a ring formed before fails its first step and
#                      leaves the unreachable peer out for gossip.exclude_for, 5 s
#                      here) or private (they reserve a relay slot at once)
#                      [case a: auto, case b: private]
#   --rate R           rate of every link to the public bridge, both ways (tc htb; the
#                      public peer's and each NAT's uplink) [100mbit]; a relayed link
#                      crosses the relay's uplink twice, which the step times show
#   --binary PATH      p2ptrain binary; without it bin/p2ptrain is built with go build
#   --timeout S        seconds one case may take before its peers are killed [150]
#   --logdir DIR       keep every peer's output there (default: a temporary directory,
#                      removed after a successful run, kept after a failure)
#   -h, --help         this text
#
# The network (every name is p2pt-nat-*, p2pnatbr*, every address in 10.77.0.0/16;
# nothing is created in or routed to the root namespace):
#
#   p2pt-nat-pub 10.77.200.10 ─┐  (each link to the bridge shaped to --rate)
#                              ├─ p2pnatbr0 (in p2pt-nat-sw), the "internet" 10.77.200.0/24
#   p2pt-nat-r1  10.77.200.1  ─┤   p2pt-nat-r2 10.77.200.2
#     NAT: 10.77.201.0/24      │     NAT: 10.77.202.0/24
#   p2pt-nat-a   10.77.201.10  │   p2pt-nat-b  10.77.202.10
#
# A router forwards its private subnet to the bridge with MASQUERADE, passes back
# only what belongs to a connection from inside, and drops unsolicited packets to
# itself (as a home or campus NAT does). No route leads from the bridge into a
# private subnet. Every peer runs `p2ptrain join` with a shared swarm key and
# node.public_nets = ["10.77.200.0/24"], which makes the bridge's subnet count as
# public internet for AutoNAT and hole punching. The public peer bootstraps the
# others and runs node.relay_service with node.reachability = "public".
#
# Printed per case: how long after the start the peers behind the NATs were
# connected to each other (through the relay or directly), how long until the
# connection was direct, the epoch that trained, and the median step time and
# all-reduce time of each peer (from --metrics-file), the direct links each
# opened (p2ptrain_allreduce_direct_links_total, polled from its API) and
# the ones that failed (logged); then one summary line per case. Each peer's `done step=N ... param_hash=H` line must be identical.
#
# Needs root, iproute2, iptables, curl and jq. Without root or network namespaces
# it prints SKIP and exits 0; any failure exits 1, bad usage 2. Every step is bounded
# in time, and a trap on EXIT/INT/TERM kills the peers and deletes the namespaces.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=p2pt-nat
BRIDGE=p2pnatbr0
NET=10.77.200 # the public side
PORT=4001
LOCK=/run/lock/p2pt-nat.lock

cases=both steps=300 reach="" rate=100mbit binary="" timeout_s=150 logdir="" mode=run

PROG=nat
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
while [ $# -gt 0 ]; do
	case "$1" in
	--case) need_arg "$@"; cases=$2; shift 2 ;;
	--steps) need_arg "$@"; steps=$2; shift 2 ;;
	--reachability) need_arg "$@"; reach=$2; shift 2 ;;
	--rate) need_arg "$@"; rate=$2; shift 2 ;;
	--binary) need_arg "$@"; binary=$2; shift 2 ;;
	--timeout) need_arg "$@"; timeout_s=$2; shift 2 ;;
	--logdir) need_arg "$@"; logdir=$2; shift 2 ;;
	--cleanup) mode=cleanup; shift ;;
	-h | --help) help; exit 0 ;;
	*) usage_err "unknown argument $1" ;;
	esac
done
case "$cases" in
a | b) case_list=("$cases") ;;
both) case_list=(a b) ;;
*) usage_err "--case must be a, b or both" ;;
esac
case "$reach" in "" | auto | private) ;; *) usage_err "--reachability must be auto or private" ;; esac
[[ "$rate" =~ ^[0-9]+(\.[0-9]+)?[kmg]?bit$ ]] || usage_err "bad --rate '$rate' (want e.g. 100mbit, 1gbit)"
int_in "$steps" 1 100000 || usage_err "--steps must be a positive integer"
int_in "$timeout_s" 10 3600 || usage_err "--timeout must be 10..3600 seconds"

skip() {
	echo "nat: SKIP: $* (the NAT test needs root, ip netns and iptables)"
	exit 0
}
[ "$(id -u)" = 0 ] || skip "not root"
command -v ip >/dev/null 2>&1 || skip "ip (iproute2) is not installed: apt-get install -y iproute2"
ip netns list >/dev/null 2>&1 || skip "ip netns does not work here"
command -v iptables >/dev/null 2>&1 || skip "iptables is not installed: apt-get install -y iptables"
for c in tc curl jq timeout; do command -v "$c" >/dev/null 2>&1 || die "$c is not installed"; done

# --- names and teardown ------------------------------------------------------

NS_SW=$PREFIX-sw NS_PUB=$PREFIX-pub
nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
our_namespaces() {
	ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-(sw|pub|r1|r2|a|b|probe)\$" || true
}
# kill_ns_pids, teardown and lock: bench/lib.sh.

[ "$mode" != cleanup ] || cleanup_and_exit

lock
status=1
work_dir p2pt-nat
on_exit() {
	local rc=$?
	trap - EXIT INT TERM
	[ "$status" = 0 ] || [ "$rc" = 0 ] || status=$rc
	teardown
	if [ "$status" = 0 ] && [ "$keep_work" = 0 ]; then rm -rf "$work"; else say "logs kept in $work"; fi
	exit "$status"
}
trap on_exit EXIT
trap 'say "interrupted"; status=130; exit 130' INT
trap 'say "terminated"; status=143; exit 143' TERM

remove_leftovers
if ! why=$(ip netns add "$PREFIX-probe" 2>&1); then skip "cannot create a network namespace: $why"; fi
ip netns del "$PREFIX-probe"

if [ -z "$binary" ]; then
	command -v go >/dev/null 2>&1 || die "go is not on PATH (needed to build bin/p2ptrain)"
	say "building bin/p2ptrain"
	(cd "$ROOT" && timeout 600 go build -o bin/p2ptrain ./cmd/p2ptrain) || die "go build failed"
	binary=$ROOT/bin/p2ptrain
fi
[ -x "$binary" ] || die "--binary $binary is not an executable file"
binary=$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")

# --- the network -----------------------------------------------------------------

no_ipv6() { nsx "$1" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6' 2>/dev/null || true; }
new_ns() { ip netns add "$1"; no_ipv6 "$1"; ip -n "$1" link set lo up; }

# cable NS DEV ADDR: a veth from NS (named DEV, address ADDR/24) to the bridge.
cable() {
	local ns=$1 dev=$2 addr=$3 port
	port=p2pnat-${ns#"$PREFIX-"}
	ip -n "$NS_SW" link add "$port" type veth peer name "$dev" netns "$ns"
	ip -n "$NS_SW" link set "$port" master "$BRIDGE" up
	ip -n "$ns" addr add "$addr/24" dev "$dev"
	ip -n "$ns" link set "$dev" up
	shape "$ns" "$dev"
	shape "$NS_SW" "$port"
}

# shape NS DEV: what DEV sends is limited to --rate.
shape() {
	nsx "$1" tc qdisc add dev "$2" root handle 1: htb default 1
	nsx "$1" tc class add dev "$2" parent 1: classid 1:1 htb rate "$rate" ceil "$rate" quantum 65536
}

# router I KIND: namespace r$I between the bridge (wan, $NET.$I) and the private
# subnet 10.77.20$I.0/24 (lan, .1) with peer namespace a or b at .10.
# KIND eim: MASQUERADE (endpoint-independent in practice); random: --random-fully.
router() {
	local i=$1 kind=$2 r=$PREFIX-r$1 h lan=10.77.20$1
	h=$PREFIX-$([ "$i" = 1 ] && echo a || echo b)
	new_ns "$r"
	new_ns "$h"
	cable "$r" wan "$NET.$i"
	ip -n "$r" link add lan type veth peer name eth0 netns "$h"
	ip -n "$r" addr add "$lan.1/24" dev lan
	ip -n "$r" link set lan up
	ip -n "$h" addr add "$lan.10/24" dev eth0
	ip -n "$h" link set eth0 up
	ip -n "$h" route add default via "$lan.1"
	nsx "$r" sysctl -q -w net.ipv4.ip_forward=1
	local masq=(-j MASQUERADE)
	[ "$kind" = eim ] || masq+=(--random-fully)
	nsx "$r" iptables -t nat -A POSTROUTING -o wan "${masq[@]}"
	nsx "$r" iptables -A FORWARD -i lan -o wan -j ACCEPT
	nsx "$r" iptables -A FORWARD -i wan -o lan -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
	nsx "$r" iptables -A FORWARD -i wan -o lan -j DROP
	# Unsolicited packets to the NAT's own address are dropped, not answered with
	# a reset: a hole-punching SYN that arrives before the peer's own SYN left
	# is then retransmitted instead of refused.
	nsx "$r" iptables -A INPUT -i wan -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
	nsx "$r" iptables -A INPUT -i wan -j DROP
}

build_network() { # kind
	new_ns "$NS_SW"
	ip -n "$NS_SW" link add "$BRIDGE" type bridge stp_state 0
	ip -n "$NS_SW" link set "$BRIDGE" up
	new_ns "$NS_PUB"
	cable "$NS_PUB" eth0 "$NET.10"
	router 1 "$1"
	router 2 "$1"
	# The private peers reach the public peer, not each other's subnet.
	reaches "$PREFIX-a" "$NET.10" || die "10.77.201.10 cannot reach the public peer through its NAT"
	reaches "$PREFIX-b" "$NET.10" || die "10.77.202.10 cannot reach the public peer through its NAT"
	! reaches "$PREFIX-a" 10.77.202.10 || die "10.77.201.10 reaches 10.77.202.10: the routers are not NATs"
}

# reaches NS IP: whether a TCP connection from NS to IP:9 gets an answer (a
# refusal counts: nothing listens there).
reaches() {
	local out
	out=$(nsx "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) && return 0
	grep -q refused <<<"$out"
}

# --- the peers -----------------------------------------------------------------

rm -f "$work/swarm.key" "$work/pub.identity"
"$binary" keygen --swarm-key "$work/swarm.key" >/dev/null 2>&1 || die "p2ptrain keygen --swarm-key failed"
pub_id=$("$binary" keygen --identity "$work/pub.identity") || die "p2ptrain keygen --identity failed"
boot="/ip4/$NET.10/tcp/$PORT/p2p/$pub_id"

peer_conf() { # name extra-node-toml
	cat >"$work/$1.toml" <<EOF
[node]
public_nets = ["$NET.0/24"]
$2
[gossip]
heartbeat = "500ms"
failure_timeout = "5s"
exclude_for = "5s"
[train]
hidden = [256, 256]
batch_size = 32
train_samples = 4096
eval_samples = 500
eval_every = 0
EOF
}

declare -A pids=()
start_peer() { # name namespace addr
	local name=$1 ns=$2 addr=$3 args
	args=(join --config "$work/$name.toml" --swarm-key "$work/swarm.key" --listen "/ip4/$addr/tcp/$PORT"
		--api 127.0.0.1:7420 --mdns=false --cluster nat --name "$name" --log-format json
		--steps "$steps" --min-peers 3 --model mlp --codec none --metrics-file "$work/$name.metrics")
	[ "$name" != pub ] || args+=(--identity "$work/pub.identity")
	[ "$name" = pub ] || args+=(--bootstrap "$boot")
	echo "ip netns exec $ns $binary ${args[*]}" >"$work/$name.cmd"
	timeout -k 5 "$timeout_s" ip netns exec "$ns" "$binary" "${args[@]}" \
		>"$work/$name.out" 2>"$work/$name.err" </dev/null 9>&- &
	pids[$name]=$!
}

show_tail() {
	say "--- $1 stderr, last lines:"
	tail -n 20 "$work/$1.err" >&2 || true
	say "--- $1 stdout, last lines:"
	tail -n 5 "$work/$1.out" >&2 || true
}

# conn_of NS PEER-ID: the connection kind the peer in NS shows for PEER-ID.
conn_of() {
	nsx "$1" curl -s -m 1 http://127.0.0.1:7420/status 2>/dev/null |
		jq -r --arg id "$2" '.members[]? | select(.peer_id == $id) | .conn // ""' 2>/dev/null || true
}
# direct_links_of NS: the peer's p2ptrain_allreduce_direct_links_total (nothing
# when its API does not answer).
direct_links_of() {
	nsx "$1" curl -s -m 1 http://127.0.0.1:7420/metrics 2>/dev/null |
		awk '$1 == "p2ptrain_allreduce_direct_links_total" { printf "%d\n", $2 }' || true
}
peer_id_of() { # NS
	nsx "$1" curl -s -m 1 http://127.0.0.1:7420/status 2>/dev/null | jq -r '.peer_id // ""' 2>/dev/null || true
}

# median FILE FIELD: the median of FIELD over the step records of a metrics file
# (steps after the first 3, which include connection set-up and warm-up).
median() {
	jq -r --arg f "$2" 'select(.kind == "step" and .step > 3) | .[$f] // 0' "$1" 2>/dev/null | sort -g |
		awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) printf "%.4f\n", v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# log_time FILE MESSAGE PEER T0: seconds from T0 (date +%s.%N) to the first log
# line of FILE with msg MESSAGE about PEER; nothing when there is none.
log_time() {
	local ts
	ts=$(jq -r --arg m "$2" --arg p "$3" 'select(.msg == $m and .peer == $p) | .ts' "$1" 2>/dev/null | head -n 1 || true)
	[ -n "$ts" ] || return 0
	awk -v a="$4" -v b="$(date -d "$ts" +%s.%N)" 'BEGIN { printf "%.1f\n", b - a }'
}

summaries=()
run_case() { # a|b
	local c=$1 kind desc r=$reach t0 now el t_conn="" t_direct="" id_b="" k name code lines=() epoch direct t_relay t_punch polls=0 v
	declare -A links=([pub]=0 [a]=0 [b]=0) ns_of=([pub]=$NS_PUB [a]=$PREFIX-a [b]=$PREFIX-b)
	if [ "$c" = a ]; then kind=eim desc="endpoint-independent NAT (MASQUERADE)"; else kind=random desc="NAT with random ports (MASQUERADE --random-fully)"; fi
	[ -n "$r" ] || { [ "$c" = a ] && r=auto; } || r=private
	say "case $c: $desc, reachability $r behind the NATs"
	teardown
	build_network "$kind"
	peer_conf pub "relay_service = true
reachability = \"public\""
	peer_conf a "reachability = \"$r\""
	peer_conf b "reachability = \"$r\""
	t0=$(date +%s.%N)
	start_peer pub "$NS_PUB" "$NET.10"
	start_peer a "$PREFIX-a" 10.77.201.10
	start_peer b "$PREFIX-b" 10.77.202.10
	declare -A rc=()
	while [ "${#rc[@]}" -lt 3 ]; do
		for name in pub a b; do
			[ -z "${rc[$name]:-}" ] || continue
			kill -0 "${pids[$name]}" 2>/dev/null && continue
			code=0
			wait "${pids[$name]}" || code=$?
			rc[$name]=$code
			if [ "$code" != 0 ]; then
				show_tail "$name"
				[ "$code" != 124 ] && [ "$code" != 137 ] || die "case $c: peer $name still running after ${timeout_s}s (timeout)"
				die "case $c: peer $name failed: exit status $code"
			fi
		done
		# Every second, each running peer's count of direct links (the
		# counter only grows; the last reading before a peer exits stays).
		if [ $((polls++ % 5)) = 0 ]; then
			for name in pub a b; do
				[ -z "${rc[$name]:-}" ] || continue
				v=$(direct_links_of "${ns_of[$name]}")
				[ -z "$v" ] || links[$name]=$v
			done
		fi
		[ -n "$id_b" ] || id_b=$(peer_id_of "$PREFIX-b")
		if [ -n "$id_b" ] && [ -z "$t_direct" ] && [ -z "${rc[a]:-}" ]; then
			k=$(conn_of "$PREFIX-a" "$id_b")
			now=$(date +%s.%N)
			el=$(awk -v a="$t0" -v b="$now" 'BEGIN { printf "%.1f\n", b - a }')
			if [ -n "$k" ] && [ -z "$t_conn" ]; then
				t_conn=$el
				say "case $c: a and b connected ($k) after ${el}s"
			fi
			if [ "$k" = direct ]; then
				t_direct=$el
				say "case $c: a and b connected directly after ${el}s"
			fi
		fi
		sleep 0.2
	done
	for name in pub a b; do
		line=$(grep -E '^done ' "$work/$name.out" | tail -n 1 || true)
		[ -n "$line" ] || { show_tail "$name"; die "case $c: peer $name printed no done line"; }
		lines+=("$line")
		say "case $c: $name: $line"
	done
	[ "${lines[0]}" = "${lines[1]}" ] && [ "${lines[0]}" = "${lines[2]}" ] || die "case $c: the peers' done lines differ"
	grep -q "done step=$steps " <<<"${lines[0]}" || die "case $c: the run did not reach step $steps: ${lines[0]}"
	# The log's times are exact where the polling above may miss a short relayed phase.
	t_relay=$(log_time "$work/a.err" "connected through a relay" "$id_b" "$t0")
	t_punch=$(log_time "$work/a.err" "direct connection to a peer reached through a relay" "$id_b" "$t0")
	[ -n "$t_direct" ] || t_direct=$t_punch
	[ -n "$t_relay" ] || [ -n "$t_conn" ] || die "case $c: a never showed a connection to b"
	[ -z "$t_relay" ] || t_conn=$t_relay
	if [ "$c" = a ] && [ -z "$t_direct" ]; then die "case $c: hole punching gave a and b no direct connection"; fi
	if [ "$c" = b ] && [ -n "$t_direct" ]; then die "case $c: a and b connected directly through a NAT with random ports"; fi
	epoch=$(jq -r 'select(.kind == "step") | .epoch' "$work/a.metrics" | sort -n | uniq | tr '\n' ',' | sed 's/,$//')
	local steps_s=() ar_s=()
	for name in pub a b; do
		steps_s+=("$name=$(median "$work/$name.metrics" step_s)")
		ar_s+=("$name=$(median "$work/$name.metrics" allreduce_s)")
	done
	say "case $c: median step time ${steps_s[*]} s; median all-reduce ${ar_s[*]} s; epochs $epoch"
	local dl=() df=() pr=()
	for name in pub a b; do
		dl+=("$name=${links[$name]}")
		df+=("$name=$(grep -c 'direct link failed' "$work/$name.err" || true)")
		pr+=("$name=$(grep -c 'to punch a hole again' "$work/$name.err" || true)")
	done
	say "case $c: direct links opened (all epochs, as sender or receiver) ${dl[*]}; failed ${df[*]}"
	say "case $c: relayed connections closed to punch a hole again ${pr[*]}"
	direct="never (relayed)"
	[ -z "$t_direct" ] || direct=${t_direct}s
	summaries+=("$(printf 'nat case %s (%s NAT, reachability %s): connected %ss, direct %s, median step_s %s, median allreduce_s %s, direct links %s (failed %s), hashes equal' \
		"$c" "$kind" "$r" "$t_conn" "$direct" "${steps_s[*]}" "${ar_s[*]}" "${dl[*]}" "${df[*]}")")
	for name in pub a b; do
		for f in metrics err out; do cp "$work/$name.$f" "$work/$c-$name.$f"; done
	done
	teardown
}

for c in "${case_list[@]}"; do run_case "$c"; done
for s in "${summaries[@]}"; do echo "$s"; done
status=0
