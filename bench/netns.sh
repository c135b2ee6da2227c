#!/usr/bin/env bash
# bench/netns.sh — all-reduce benchmark of p2ptrain on N test hosts built from
# Linux network namespaces behind a bridge, each host's link shaped with tc.
#
# Usage:
#   bench/netns.sh [options] [-- extra p2ptrain flags]   ({host} in them becomes h1, h2, ...;
#                                   e.g. -- --cpuprofile /tmp/cpu-{host}.pprof)
#   bench/netns.sh --smoke          CI: 3 hosts, 100mbit, 4MiB, 2 rounds, < 60 s
#   bench/netns.sh --check [...]    build the network, measure each link, no daemons
#   bench/netns.sh --cleanup        remove what an earlier (crashed, --keep, --up) run left
#   bench/netns.sh --up [...]       build the network (--hosts, --rate(s), --loss, ...) and leave it
#                                   up for another program (the chaos suite); --cleanup removes it
#
# Options (defaults in brackets):
#   --hosts N          number of test hosts, 1..64 [4; or the length of --rates]
#   --rate R           every host's link rate, tc units: 100mbit, 1gbit, 500kbit [1gbit]
#   --rates R1,R2,...  one rate per host (host 1 first); sets --hosts when it is not given
#   --delay D          one-way delay added to every packet a host sends: 1ms, 500us [none]
#                      (so host-to-host latency is D and the round trip 2·D); needs
#                      the kernel's netem qdisc (sch_netem)
#   --loss P           loss probability for every packet a host sends: 0.1% [none]
#                      (netem; without netem, a classic-BPF tc filter on the bridge port)
#   --mtu M            MTU of every link [1500]; TCP goodput is 1448/1514 = 0.956 of the
#                      shaped rate at 1500 (tc counts the Ethernet header), 0.993 at 9000
#   --shaper htb|tbf   the qdisc that shapes each link [htb]. htb counts a segmentation-
#                      offload (GSO) packet of up to 64 kB as one and lets it through whole
#                      while it has tokens, so a message after idle can cross a slow link
#                      unshaped; tbf cuts GSO packets bigger than its burst into segments
#                      (burst: 2 frames, or 1 ms at the rate if that is more), so every
#                      message is spaced at the rate while the hosts keep offload's CPU cost
#   --queue P          packets each shaped link may queue (a pfifo under the htb class, in
#                      both directions) [the kernel's default: the device's txqueuelen,
#                      1000, i.e. 120 ms at 100mbit]; e.g. 100 for a shallow switch buffer
#   --cc NAME          TCP congestion control of every host (set in its namespace):
#                      one of /proc/sys/net/ipv4/tcp_allowed_congestion_control (a
#                      namespace may not pick others), or "default" for the root
#                      namespace's [cubic, Linux's default, where a namespace may
#                      use it, else reno: both loss-based]. Not the root's default,
#                      which may be bbr (it is on the machine the README's figures
#                      come from): htb lets a whole offload packet through at once,
#                      and bbr's rate samples then misjudge the link (there, at 4 x
#                      100mbit, sint8's all-reduce reached 0.85 of its ideal under
#                      bbr and 0.99 under reno); scripts/cc-table.sh measures both.
#   --size S           all-reduced buffer size [64MiB]
#   --codec C          codec spec, e.g. fp32, int8, qsgd:bits=4 [fp32]; fp32 is passed
#                      to p2ptrain as its name for plain float32, "none"
#   --schedule S       ring | direct | allgather | proportional | auto [ring]
#   --rounds N         timed rounds [5]
#   --binary PATH      p2ptrain binary to run; without it bin/p2ptrain is (re)built
#                      with `go build` (incremental, so cheap when up to date)
#   --out FILE         append each host's JSON object (plus host, rate, delay, loss,
#                      mtu, swarm_key, tcp, hosts) as one line to FILE (JSON Lines)
#   --timeout S        seconds the daemons may run before they are killed and the run
#                      fails [estimated from size, rate and rounds, at least 90]
#   --logdir DIR       keep every host's stdout/stderr there (default: a temporary
#                      directory, removed after a successful run, kept after a failure)
#   --check            only build the network and verify it: each host sends to the
#                      next one for ~1.5 s, the measured rate is compared with the
#                      shaped one (fails when a link is faster than 1.1× its rate);
#                      then every host sends to the next at once for ~3 s (plain TCP
#                      in a ring: what the machine's CPUs allow all links together)
#   --open             run the daemons without a swarm key (--open): Noise encryption
#                      only, no private-network stream cipher; shows what the swarm key costs
#   --gloo             after the daemons, run PyTorch's gloo all-reduce (fp32, the same
#                      --size and --rounds) on the same hosts with bench/gloo_allreduce.py
#                      (Debian's /usr/bin/python3 with torch; override with $GLOO_PYTHON)
#                      and print it beside p2ptrain's: busbw and CPU-seconds per GB
#                      all-reduced per process, each as p2ptrain's over gloo's
#   --keep             leave the namespaces up at the end (inspect with
#                      `ip netns exec p2pt-h1 ...`; remove with --cleanup)
#   -h, --help         this text
#
# Each host i (1..N) is namespace p2pt-hi with one interface eth0, address 10.77.0.(10+i)/24,
# cabled by a veth pair to port hi of bridge br0, which lives in its own namespace
# p2pt-br. Nothing is created in, routed to or changed in the root namespace: the
# subnet exists only inside those namespaces, which have no default route, so no
# traffic can leave them. A host's rate applies in both directions of its link: an
# htb class on eth0 (what the host sends) and one on the bridge port (what it
# receives), so a host's rate behaves like its NIC's; delay and loss (netem) sit
# under the host-side class only, so every packet meets them once. Without root
# or a working `ip netns`, --smoke prints SKIP and exits 0.
#
# The daemons: host 1 gets a persistent identity (`p2ptrain keygen --identity`) so
# its multiaddr /ip4/10.77.0.11/tcp/4001/p2p/<id> is known before it starts; all
# hosts share a swarm key and run
#   p2ptrain bench allreduce --expect N --size S --codec C --schedule S --rounds N --json
#     --listen /ip4/10.77.0.(10+i)/tcp/4001 --swarm-key K (--open with --open) --identity F --name hi
#     --cluster netns-bench --mdns=false --link-rate <its goodput> [--bootstrap <host 1>] [extra flags]
# Each prints one JSON object {"size_bytes","codec","schedule","peers","median_s",
# "algbw_gbps","busbw_gbps","wire_bytes_per_peer","ideal_s","efficiency"} on stdout
# and exits; the script prints each host's line, then a summary line with busbw over
# the slowest link's rate (gbps read as Gbit/s), the efficiency: the ideal (the
# most bytes a host sent, at its link's TCP goodput: see goodput_rate) over the
# median time, and
# cpu_s_per_gb: the CPU time (user + system) a daemon used over the timed rounds
# per GB of buffer all-reduced, the mean over the hosts. With --gloo, each gloo
# rank's JSON line ("impl":"gloo") follows, then a line "gloo: ..." with its
# median, busbw and cpu_s_per_gb and the ratios cpu_ratio (p2ptrain's CPU per GB
# over gloo's) and busbw_ratio (p2ptrain's busbw over gloo's).
# machine_cpu_s_per_gb is each host's share of the whole machine's busy CPU time
# (/proc/stat: every process, and the kernel's network work, which runs in
# whichever process's time slice or in none) over the timed rounds per GB, the
# mean over the hosts' readings divided by the hosts: every host runs on this
# machine, so it counts what the daemons cost together, charged alike to both
# programs. gloo's line has its machine_cpu_s_per_gb and machine_cpu_ratio too.
#
# Needs root, iproute2 (ip, tc) and Go (to build p2ptrain and the netcheck probe;
# on a machine without Go, --binary and $NETCHECK name prebuilt ones).
# Without root or network namespaces --smoke says why and exits 0 (skipped);
# everything else exits 1 on any failure, 2 on bad usage. Everything is bounded in
# time, and a trap on EXIT/INT/TERM kills the daemons and deletes the namespaces.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=p2pt
SUBNET=10.77.0
PORT=4001
LOCK=/run/lock/p2pt-netns.lock

hosts="" rate="1gbit" rates="" delay="" loss="" mtu=1500 queue="" cc="" shaper=htb
size="64MiB" codec="fp32" schedule="ring" rounds=5
binary="" out="" timeout_s="" logdir="" mode="bench" keep=0 smoke=0 open=0 gloo=0
extra=()

PROG=netns
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
while [ $# -gt 0 ]; do
	case "$1" in
	--hosts) need_arg "$@"; hosts=$2; shift 2 ;;
	--rate) need_arg "$@"; rate=$2; shift 2 ;;
	--rates) need_arg "$@"; rates=$2; shift 2 ;;
	--delay) need_arg "$@"; delay=$2; shift 2 ;;
	--loss) need_arg "$@"; loss=$2; shift 2 ;;
	--mtu) need_arg "$@"; mtu=$2; shift 2 ;;
	--queue) need_arg "$@"; queue=$2; shift 2 ;;
	--shaper) need_arg "$@"; shaper=$2; shift 2 ;;
	--cc) need_arg "$@"; cc=$2; shift 2 ;;
	--size) need_arg "$@"; size=$2; shift 2 ;;
	--codec) need_arg "$@"; codec=$2; shift 2 ;;
	--schedule) need_arg "$@"; schedule=$2; shift 2 ;;
	--rounds) need_arg "$@"; rounds=$2; shift 2 ;;
	--binary) need_arg "$@"; binary=$2; shift 2 ;;
	--out) need_arg "$@"; out=$2; shift 2 ;;
	--timeout) need_arg "$@"; timeout_s=$2; shift 2 ;;
	--logdir) need_arg "$@"; logdir=$2; shift 2 ;;
	--check) mode=check; shift ;;
	--up) mode=up; shift ;;
	--cleanup) mode=cleanup; shift ;;
	--keep) keep=1; shift ;;
	--open) open=1; shift ;;
	--gloo) gloo=1; shift ;;
	--smoke) smoke=1; shift ;;
	-h | --help) help; exit 0 ;;
	--) shift; extra=("$@"); break ;;
	*) usage_err "unknown argument $1" ;;
	esac
done

if [ "$smoke" = 1 ]; then
	# The CI smoke test: small enough to finish in well under a minute once built.
	hosts=3 rate=100mbit rates="" size=4MiB rounds=2
	[ -n "$timeout_s" ] || timeout_s=45
fi

# --- preconditions -----------------------------------------------------------

skip_or_die() {
	if [ "$smoke" = 1 ]; then
		echo "netns: SKIP: $* (the namespace benchmark needs root and ip netns)"
		status=0
		exit 0
	fi
	die "$*"
}
[ "$(id -u)" = 0 ] || skip_or_die "not root"
command -v ip >/dev/null 2>&1 || skip_or_die "ip (iproute2) is not installed: apt-get install -y iproute2"
ip netns list >/dev/null 2>&1 || skip_or_die "ip netns does not work here"
command -v tc >/dev/null 2>&1 || die "tc (iproute2) is not installed: apt-get install -y iproute2"
command -v timeout >/dev/null 2>&1 || die "timeout (coreutils) is missing"

# --- names and teardown ------------------------------------------------------

host_ns() { echo "$PREFIX-h$1"; }
BR_NS=$PREFIX-br

# our_namespaces lists the namespaces this script creates (also leftovers).
our_namespaces() {
	ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-(h[0-9]+|br|probe)\$" || true
}

# kill_ns_pids, teardown and lock come from bench/lib.sh.

[ "$mode" != cleanup ] || cleanup_and_exit

# --- arguments ---------------------------------------------------------------

# rate_bps prints a tc bit rate ("100mbit", "1.5gbit", "800kbit", "1000000bit")
# in bits per second; it fails on anything else (tc's *bps units are bytes).
rate_bps() {
	awk -v r="$1" 'BEGIN {
		if (!match(r, /^[0-9]+(\.[0-9]+)?/)) exit 1
		v = substr(r, 1, RLENGTH) + 0; u = tolower(substr(r, RLENGTH + 1))
		m["bit"] = 1; m[""] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
		if (!(u in m) || v <= 0) exit 1
		printf "%.0f\n", v * m[u] }'
}

# goodput_rate prints, for a tc rate R, the TCP payload rate a link shaped to R
# carries at this MTU, in tc units ("95640687bit" for 100mbit at 1500): each
# frame of MTU+14 bytes (tc counts the Ethernet header) carries MTU−52 bytes
# of payload (IPv4 20, TCP 20, timestamps 12), 1448/1514 = 0.956 at 1500.
# --check measures it: 95.7–95.8 Mbit/s on a 100mbit link. No TCP sender, gloo
# included, can move more, so it is the link-limited ideal's rate.
goodput_rate() { # rate
	awk -v bps="$(rate_bps "$1")" -v m="$mtu" 'BEGIN { printf "%.0fbit\n", bps * (m - 52) / (m + 14) }'
}

# size_bytes prints a size like 64MiB, 4MB, 512KiB, 1GiB or 1000 in bytes.
size_bytes() {
	awk -v s="$1" 'BEGIN {
		if (!match(s, /^[0-9]+(\.[0-9]+)?/)) exit 1
		v = substr(s, 1, RLENGTH) + 0; u = substr(s, RLENGTH + 1)
		m[""] = 1; m["B"] = 1; m["KiB"] = 1024; m["MiB"] = 1048576; m["GiB"] = 1073741824
		m["K"] = 1e3; m["KB"] = 1e3; m["M"] = 1e6; m["MB"] = 1e6; m["G"] = 1e9; m["GB"] = 1e9
		if (!(u in m)) exit 1
		printf "%.0f\n", v * m[u] }'
}

if [ -n "$rates" ]; then
	IFS=, read -r -a rate_list <<<"$rates"
	[ -n "$hosts" ] || hosts=${#rate_list[@]}
	[ "${#rate_list[@]}" = "$hosts" ] || usage_err "--rates has ${#rate_list[@]} entries for $hosts hosts"
else
	[ -n "$hosts" ] || hosts=4
	rate_list=()
fi
int_in "$hosts" 1 64 || usage_err "--hosts must be 1..64"
if [ -z "$rates" ]; then
	for ((i = 0; i < hosts; i++)); do rate_list+=("$rate"); done
fi
min_bps=""
for r in "${rate_list[@]}"; do
	b=$(rate_bps "$r") || usage_err "bad rate '$r' (want e.g. 100mbit, 1gbit, 500kbit)"
	if [ -z "$min_bps" ] || [ "$b" -lt "$min_bps" ]; then min_bps=$b; fi
done
int_in "$mtu" 576 65000 || usage_err "--mtu must be 576..65000"
[ -z "$queue" ] || int_in "$queue" 2 100000 || usage_err "--queue must be 2..100000 packets"
case "$shaper" in htb | tbf) ;; *) usage_err "--shaper must be htb or tbf" ;; esac
allowed_cc=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control 2>/dev/null || true)
case "$cc" in
default) cc="" ;;
"")
	for c in cubic reno; do
		if grep -qwF -- "$c" <<<"$allowed_cc"; then cc=$c && break; fi
	done
	;;
*) grep -qwF -- "$cc" <<<"$allowed_cc" || usage_err "--cc $cc: not one a network namespace may use here ($allowed_cc)" ;;
esac
# What the hosts' TCP uses: a new namespace starts with the root's default.
tcp_cc=${cc:-$(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo unknown)}
int_in "$rounds" 1 100000 || usage_err "--rounds must be a positive integer"
[ -z "$delay" ] || [[ "$delay" =~ ^[0-9]+(\.[0-9]+)?(s|ms|us)$ ]] || usage_err "bad --delay '$delay' (want e.g. 1ms, 500us)"
[ -z "$loss" ] || [[ "$loss" =~ ^[0-9]+(\.[0-9]+)?%$ ]] || usage_err "bad --loss '$loss' (want e.g. 0.1%)"
[ -z "$timeout_s" ] || [[ "$timeout_s" =~ ^[0-9]+$ ]] || usage_err "--timeout wants whole seconds"
size_b=$(size_bytes "$size") || usage_err "bad --size '$size' (want e.g. 64MiB, 4MiB, 1000000)"
[[ "$schedule" =~ ^[a-z]+$ ]] || usage_err "bad --schedule '$schedule' (e.g. ring, direct, allgather, proportional, auto)"

if [ -z "$timeout_s" ]; then
	# A ring moves 2(N-1)/N of the buffer through every link each round; allow
	# rounds + 2 (warm-up, ramp) such rounds at the slowest rate three times over.
	timeout_s=$(awk -v n="$hosts" -v s="$size_b" -v b="$min_bps" -v r="$rounds" 'BEGIN {
		t = (n > 1 ? 2 * (n - 1) / n : 1) * s * 8 / b * (r + 2) * 3 + 60
		if (t < 90) t = 90
		printf "%d\n", t }')
fi

# --- work directory, binaries --------------------------------------------------

lock
start_s=$SECONDS
status=1
if [ -n "$logdir" ]; then
	mkdir -p "$logdir"
	work=$(cd "$logdir" && pwd)
	keep_work=1
else
	work=$(mktemp -d /tmp/p2pt-netns.XXXXXX)
	keep_work=0
fi

on_exit() {
	local rc=$?
	trap - EXIT INT TERM
	[ "$status" = 0 ] || [ "$rc" = 0 ] || status=$rc
	if [ "$keep" = 1 ] && [ "$status" = 0 ]; then
		say "--keep: namespaces left up ($(our_namespaces | tr '\n' ' ')); remove with $0 --cleanup"
	else
		teardown
	fi
	if [ "$status" = 0 ] && [ "$keep_work" = 0 ]; then
		rm -rf "$work"
	else
		say "logs kept in $work"
	fi
	exit "$status"
}
trap on_exit EXIT
trap 'say "interrupted"; status=130; exit 130' INT
trap 'say "terminated"; status=143; exit 143' TERM

leftover=$(our_namespaces | tr '\n' ' ')
if [ -n "$leftover" ]; then
	say "removing leftovers of an earlier run: $leftover"
	teardown
fi

# Can this machine make network namespaces at all (a container without
# CAP_SYS_ADMIN cannot, even as root)?
if ! why=$(ip netns add "$PREFIX-probe" 2>&1); then
	skip_or_die "cannot create a network namespace: $why"
fi
ip netns del "$PREFIX-probe"

gobuild() { # output package
	command -v go >/dev/null 2>&1 || die "go is not on PATH (needed to build $2)"
	(cd "$ROOT" && timeout 600 go build -o "$1" "$2") || die "go build $2 failed"
}

if [ "$mode" = bench ]; then
	if [ -z "$binary" ]; then
		say "building bin/p2ptrain"
		gobuild "$ROOT/bin/p2ptrain" ./cmd/p2ptrain
		binary=$ROOT/bin/p2ptrain
	fi
	[ -x "$binary" ] || die "--binary $binary is not an executable file"
	binary=$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")
	help_out=$(timeout 20 "$binary" bench allreduce --help 2>&1 || true)
	grep -q -- "expect" <<<"$help_out" ||
		die "$binary has no working 'bench allreduce' (its --help shows no --expect flag): ${help_out:0:300}"
	if [ "$gloo" = 1 ]; then
		GLOO_PY=${GLOO_PYTHON:-/usr/bin/python3}
		timeout 60 "$GLOO_PY" -c 'import torch.distributed' 2>/dev/null ||
			die "--gloo: $GLOO_PY cannot import torch.distributed (set GLOO_PYTHON to a python3 with torch)"
	fi
fi
if [ "$mode" = check ] || [ "$smoke" = 1 ]; then
	if [ -n "${NETCHECK:-}" ]; then
		[ -x "$NETCHECK" ] || die "NETCHECK=$NETCHECK is not an executable file"
		cp "$NETCHECK" "$work/netcheck"
	else
		gobuild "$work/netcheck" ./bench/netcheck
	fi
fi

# --- the network -----------------------------------------------------------------

host_ip() { echo "$SUBNET.$((10 + $1))"; }
nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# netem_works says whether the kernel has the netem qdisc (sch_netem), tried
# on the loopback device of the bridge namespace.
netem_works() {
	nsx "$BR_NS" tc qdisc add dev lo root handle 1: netem delay 0ms >/dev/null 2>&1 || return 1
	nsx "$BR_NS" tc qdisc del dev lo root >/dev/null 2>&1 || true
}

# shape DEV in NS to RATE with an htb class or a tbf (--shaper); on the host
# side (with_netem=1) delay and loss hang under it as a netem qdisc. htb's
# quantum is set explicitly: the default (rate/10) is far too big for fast
# links and only earns a kernel warning. tbf's burst is 2 full frames or 1 ms
# at the rate, whichever is more: small enough that tbf segments GSO packets
# on slow links, big enough that its timer keeps up on fast ones.
shape() { # ns dev rate with_netem
	local ns=$1 dev=$2 r=$3 netem=$4 args=()
	if [ "$shaper" = tbf ]; then
		local burst
		burst=$(awk -v bps="$(rate_bps "$r")" -v m="$mtu" 'BEGIN { b = bps / 8000; f = 2 * (m + 14); printf "%d", (b > f) ? b : f }')
		nsx "$ns" tc qdisc add dev "$dev" root handle 1: tbf rate "$r" burst "$burst" limit $((1000 * (mtu + 14)))
	else
		nsx "$ns" tc qdisc add dev "$dev" root handle 1: htb default 1
		nsx "$ns" tc class add dev "$dev" parent 1: classid 1:1 htb rate "$r" ceil "$r" quantum 65536
	fi
	if [ "$netem" = 1 ] && [ "$use_netem" = 1 ]; then
		[ -z "$delay" ] || args+=(delay "$delay")
		[ -z "$loss" ] || args+=(loss "$loss")
		nsx "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: netem "${args[@]}" limit "${queue:-100000}"
	elif [ -n "$queue" ]; then
		nsx "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: pfifo limit "$queue"
	fi
}

# drop_randomly drops the share --loss of the packets that enter the bridge
# through port DEV (what its host sends), for kernels without netem: a classic
# BPF classifier on the port's ingress, "A = random u32; A < threshold ? drop : pass".
drop_randomly() { # dev
	local thr
	thr=$(awk -v p="${loss%\%}" 'BEGIN { printf "%.0f\n", p / 100 * 4294967296 }')
	nsx "$BR_NS" tc qdisc add dev "$1" ingress
	nsx "$BR_NS" tc filter add dev "$1" parent ffff: bpf da \
		bytecode "4,32 0 0 4294963256,53 0 1 $thr,6 0 0 0,6 0 0 2"
}

# The namespaces have no route but 10.77.0.0/24 on eth0 and no IPv6, so no
# packet can go anywhere but to another test host.
no_ipv6() { nsx "$1" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6' 2>/dev/null || true; }

build_network() {
	local i ns
	ip netns add "$BR_NS"
	no_ipv6 "$BR_NS"
	ip -n "$BR_NS" link set lo up
	use_netem=0
	if [ -n "$delay" ] || [ -n "$loss" ]; then
		if netem_works; then
			use_netem=1
		elif [ -n "$delay" ]; then
			die "--delay needs the kernel's netem qdisc (sch_netem), which this kernel lacks"
		else
			say "no netem in this kernel: --loss $loss is applied by a BPF classifier on the bridge ports"
		fi
	fi
	ip -n "$BR_NS" link add br0 mtu "$mtu" type bridge stp_state 0
	ip -n "$BR_NS" link set br0 up
	for ((i = 1; i <= hosts; i++)); do
		ns=$(host_ns "$i")
		ip netns add "$ns"
		no_ipv6 "$ns"
		ip -n "$ns" link set lo up
		# Through /proc/sys, not sysctl(8): a minimal system may lack procps.
		[ -z "$cc" ] || nsx "$ns" sh -c 'echo "$1" >/proc/sys/net/ipv4/tcp_congestion_control' sh "$cc" ||
			die "cannot set TCP congestion control $cc in $ns"
		ip -n "$BR_NS" link add "h$i" mtu "$mtu" type veth peer name eth0 mtu "$mtu" netns "$ns"
		ip -n "$BR_NS" link set "h$i" master br0 up
		ip -n "$ns" addr add "$(host_ip "$i")/24" dev eth0
		ip -n "$ns" link set eth0 up
		shape "$ns" eth0 "${rate_list[i - 1]}" 1
		shape "$BR_NS" "h$i" "${rate_list[i - 1]}" 0
		if [ -n "$loss" ] && [ "$use_netem" = 0 ]; then drop_randomly "h$i"; fi
	done
}

say "$hosts hosts, rates ${rate_list[*]}, delay ${delay:-0}, loss ${loss:-0%}, mtu $mtu, queue ${queue:-default}, tcp $tcp_cc; logs in $work"
build_network

# --- check: measure every link with the netcheck probe ---------------------------

# link_bps prints the rate (bit/s) of the path from host I to host J: the
# slower of their two links.
link_bps() { # i j
	local a b
	a=$(rate_bps "${rate_list[$1 - 1]}")
	b=$(rate_bps "${rate_list[$2 - 1]}")
	if [ "$a" -le "$b" ]; then echo "$a"; else echo "$b"; fi
}

# probe_bytes prints how much netcheck sends to keep a link of BPS bit/s busy
# for SECONDS (at least 256 KiB).
probe_bytes() { # bps seconds
	awk -v b="$1" -v s="$2" 'BEGIN { x = b / 8 * s; if (x < 262144) x = 262144; printf "%d\n", x }'
}

# link_ratio prints netcheck's measured Mbit/s (from its JSON, $1) and its
# ratio to BPS bit/s ($2), separated by a space.
link_ratio() { # json bps
	local mbit
	mbit=$(sed -nE 's/.*"mbit_s":([0-9.eE+-]+).*/\1/p' <<<"$1")
	awk -v m="$mbit" -v b="$2" 'BEGIN { printf "%s %.3f\n", m, m * 1e6 / b }'
}

check_links() {
	local i j bytes res mbit rtt ratio fail=0 exp_bps
	for ((i = 1; i <= hosts; i++)); do
		j=$((i % hosts + 1))
		[ "$i" != "$j" ] || { say "check: one host, nothing to measure"; return 0; }
		exp_bps=$(link_bps "$i" "$j")
		bytes=$(probe_bytes "$exp_bps" 1.5)
		timeout 40 ip netns exec "$(host_ns "$j")" "$work/netcheck" serve \
			--listen "$(host_ip "$j"):5201" --timeout 30s 2>/dev/null 9>&- &
		local srv=$!
		res=$(timeout 35 ip netns exec "$(host_ns "$i")" "$work/netcheck" send \
			--to "$(host_ip "$j"):5201" --bytes "$bytes" --timeout 30s) || {
			kill "$srv" 2>/dev/null || true
			wait "$srv" 2>/dev/null || true
			say "check: h$i -> h$j: no transfer"
			return 1
		}
		kill "$srv" 2>/dev/null || true
		wait "$srv" 2>/dev/null || true
		read -r mbit ratio <<<"$(link_ratio "$res" "$exp_bps")"
		rtt=$(sed -nE 's/.*"rtt_ms":([0-9.eE+-]+).*/\1/p' <<<"$res")
		printf 'check: h%d -> h%d  %8.1f Mbit/s  shaped %8.1f Mbit/s  ratio %s  rtt %s ms\n' \
			"$i" "$j" "$mbit" "$(awk -v b="$exp_bps" 'BEGIN { print b / 1e6 }')" "$ratio" "$rtt"
		if awk -v r="$ratio" 'BEGIN { exit !(r > 1.10) }'; then
			say "check: h$i -> h$j is faster than its shaped rate: the tc shaping is not in effect"
			fail=1
		elif awk -v r="$ratio" 'BEGIN { exit !(r < 0.75) }'; then
			say "check: warning: h$i -> h$j reaches only $ratio of its rate (busy machine or loss?)"
		fi
	done
	return "$fail"
}

if [ "$mode" = up ]; then
	keep=1 status=0
	say "network up: namespaces $(our_namespaces | tr '\n' ' ')"
	exit 0
fi
if [ "$mode" = check ] || [ "$smoke" = 1 ]; then
	check_links || die "link check failed"
fi
# check_ring measures every link at once, host i sending to host i+1 as a ring
# all-reduce does, for ~3 s: the plain-TCP ceiling of the ring on this machine
# (on a small one, the CPUs shared by every host's flows bound it).
check_ring() {
	local i j p srvs=() snds=() bps=() mbit ratio ok=1
	[ "$hosts" -ge 2 ] || return 0
	for ((i = 1; i <= hosts; i++)); do
		timeout 40 ip netns exec "$(host_ns "$i")" "$work/netcheck" serve \
			--listen "$(host_ip "$i"):5202" --timeout 30s 2>/dev/null 9>&- &
		srvs+=($!)
	done
	for ((i = 1; i <= hosts; i++)); do
		j=$((i % hosts + 1))
		bps[i]=$(link_bps "$i" "$j")
		timeout 35 ip netns exec "$(host_ns "$i")" "$work/netcheck" send \
			--to "$(host_ip "$j"):5202" --bytes "$(probe_bytes "${bps[i]}" 3)" --timeout 30s >"$work/ring$i.json" 9>&- &
		snds+=($!)
	done
	for p in "${snds[@]}"; do wait "$p" || ok=0; done
	kill "${srvs[@]}" 2>/dev/null || true
	wait "${srvs[@]}" 2>/dev/null || true
	[ "$ok" = 1 ] || { say "check: ring: a transfer failed"; return 1; }
	for ((i = 1; i <= hosts; i++)); do
		read -r mbit ratio <<<"$(link_ratio "$(cat "$work/ring$i.json")" "${bps[i]}")"
		printf 'check: ring, all at once: h%d -> h%d  %8.1f Mbit/s  ratio %s\n' "$i" "$((i % hosts + 1))" "$mbit" "$ratio"
	done
}

if [ "$mode" = check ]; then
	check_ring || die "ring check failed"
	status=0
	exit 0
fi

# --- the daemons -------------------------------------------------------------------

"$binary" keygen --swarm-key "$work/swarm.key" 2>/dev/null || die "p2ptrain keygen --swarm-key failed"
# Persistent identities make host 1's multiaddr known before it starts (and the
# peer IDs, hence the coordinator, stable within a run). A binary without
# --identity still works: host 1's address is then read from what it prints.
ids=()
has_identity=0
if grep -q -- "-identity" <<<"$help_out"; then
	has_identity=1
	for ((i = 1; i <= hosts; i++)); do
		id=$("$binary" keygen --identity "$work/h$i.identity") || die "p2ptrain keygen --identity failed"
		ids+=("$id")
	done
	boot="/ip4/$(host_ip 1)/tcp/$PORT/p2p/${ids[0]}"
else
	for ((i = 1; i <= hosts; i++)); do ids+=("?"); done
	boot=""
fi

# "fp32" (plain float32, what the issue calls it) is compress's codec "none".
p2p_codec=$codec
[ "$codec" != fp32 ] || p2p_codec=none

pids=()
start_daemon() { # host
	local i=$1 args
	args=(bench allreduce --expect "$hosts" --size "$size" --codec "$p2p_codec" --schedule "$schedule"
		--rounds "$rounds" --json --listen "/ip4/$(host_ip "$i")/tcp/$PORT"
		--name "h$i" --cluster netns-bench --mdns=false)
	if [ "$open" = 1 ]; then
		args+=(--open)
	else
		args+=(--swarm-key "$work/swarm.key")
	fi
	[ "$has_identity" = 0 ] || args+=(--identity "$work/h$i.identity")
	# The link's TCP goodput gives the link-limited ideal and the efficiency.
	! grep -q -- "-link-rate" <<<"$help_out" || args+=(--link-rate "$(goodput_rate "${rate_list[i - 1]}")")
	[ "$i" = 1 ] || args+=(--bootstrap "$boot")
	args+=("${extra[@]//\{host\}/h$i}")
	echo "ip netns exec $(host_ns "$i") $binary ${args[*]}" >"$work/h$i.cmd"
	timeout -k 5 "$timeout_s" ip netns exec "$(host_ns "$i")" "$binary" "${args[@]}" \
		>"$work/h$i.out" 2>"$work/h$i.err" </dev/null 9>&- &
	pids[i]=$!
}

show_tail() { # host
	say "--- h$1 (${ids[$1 - 1]}) stderr, last lines:"
	tail -n 15 "$work/h$1.err" >&2 || true
	say "--- h$1 stdout, last lines:"
	tail -n 5 "$work/h$1.out" >&2 || true
}

start_daemon 1
# Wait (bounded) until host 1 listens, so the others' first dial can succeed.
ready=0
for ((t = 0; t < 150; t++)); do
	if nsx "$(host_ns 1)" ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q .; then ready=1; break; fi
	kill -0 "${pids[1]}" 2>/dev/null || break
	sleep 0.2
done
if [ "$ready" != 1 ]; then
	show_tail 1
	die "host 1 did not start listening on $(host_ip 1):$PORT"
fi
if [ -z "$boot" ]; then
	# "dial this peer at:" and then lines like /ip4/10.77.0.11/tcp/4001/p2p/12D3KooW...
	for ((t = 0; t < 100; t++)); do
		boot=$(cat "$work/h1.out" "$work/h1.err" 2>/dev/null |
			grep -oE "/ip4/$(host_ip 1)/tcp/$PORT/p2p/[1-9A-HJ-NP-Za-km-z]+" | head -n 1 || true)
		[ -z "$boot" ] || break
		sleep 0.2
	done
	if [ -z "$boot" ]; then
		show_tail 1
		die "host 1 printed no multiaddr /ip4/$(host_ip 1)/tcp/$PORT/p2p/<id>"
	fi
	ids[0]=${boot##*/}
fi
say "timeout ${timeout_s}s; host 1 is $boot"
for ((i = 2; i <= hosts; i++)); do start_daemon "$i"; done

# Wait for every daemon; when one fails, stop the others at once.
declare -A rc=()
failed=""
while [ "${#rc[@]}" -lt "$hosts" ]; do
	for ((i = 1; i <= hosts; i++)); do
		[ -z "${rc[$i]:-}" ] || continue
		kill -0 "${pids[i]}" 2>/dev/null && continue
		code=0
		wait "${pids[i]}" || code=$?
		rc[$i]=$code
		if [ "$code" != 0 ] && [ -z "$failed" ]; then failed=$i; fi
	done
	if [ -n "$failed" ]; then break; fi
	sleep 0.2
done
if [ -n "$failed" ]; then
	code=${rc[$failed]}
	why="exit status $code"
	{ [ "$code" = 124 ] || [ "$code" = 137 ]; } && why="still running after ${timeout_s}s (timeout)"
	show_tail "$failed"
	for ((i = 1; i <= hosts; i++)); do
		[ -n "${rc[$i]:-}" ] || kill -TERM "${pids[i]}" 2>/dev/null || true
	done
	die "host h$failed failed: $why"
fi

# --- results -----------------------------------------------------------------------

json_field() { # name <<<json: a number, or a string without quotes
	sed -nE "s/.*\"$1\"[[:space:]]*:[[:space:]]*(\"([^\"]*)\"|([-0-9.eE+]+)).*/\2\3/p" | head -n 1
}

lines=()
for ((i = 1; i <= hosts; i++)); do
	line=$(grep -E '^[[:space:]]*\{' "$work/h$i.out" | tail -n 1 || true)
	for f in size_bytes codec schedule peers median_s algbw_gbps busbw_gbps; do
		if [ -z "$line" ] || [ -z "$(json_field "$f" <<<"$line")" ]; then
			show_tail "$i"
			die "host h$i exited 0 but printed no JSON object with \"$f\" on stdout"
		fi
	done
	lines+=("$line")
done

ts=$(date -u +%Y-%m-%dT%H:%M:%SZ)
swarm_key=true
[ "$open" = 0 ] || swarm_key=false
for ((i = 1; i <= hosts; i++)); do
	line=$(sed -E 's/[[:space:]]*\}[[:space:]]*$//' <<<"${lines[i - 1]}")
	line="$line,\"host\":\"h$i\",\"hosts\":$hosts,\"rate\":\"${rate_list[i - 1]}\",\"delay\":\"${delay:-0ms}\",\"loss\":\"${loss:-0%}\",\"mtu\":$mtu,\"swarm_key\":$swarm_key,\"tcp\":\"$tcp_cc\",\"time\":\"$ts\"}"
	echo "$line"
	[ -z "$out" ] || echo "$line" >>"$out"
done

first=${lines[0]}
median=$(json_field median_s <<<"$first")
busbw=$(json_field busbw_gbps <<<"$first")
algbw=$(json_field algbw_gbps <<<"$first")
peers=$(json_field peers <<<"$first")
# The busiest link's ideal: the largest any host reports.
wire=$(json_field wire_bytes_per_peer <<<"$first")
ideal=$(for l in "${lines[@]}"; do json_field ideal_s <<<"$l"; done | awk '$1 > x { x = $1 } END { if (x > 0) print x }')
efficiency=$(awk -v i="$ideal" -v m="$median" 'BEGIN { if (i > 0 && m > 0) printf "%.3f", i / m }')
# mean_of FIELD LINES...: the mean of a numeric field over the lines that have it.
mean_of() {
	local f=$1 l
	shift
	for l in "$@"; do json_field "$f" <<<"$l"; done | awk '$1 != "" { s += $1; n++ } END { if (n > 0) printf "%.3f", s / n }'
}
cpu=$(mean_of cpu_s_per_gb "${lines[@]}")
# share_of FIELD LINES...: a machine-wide figure's mean over the lines, split over the hosts.
share_of() {
	mean_of "$@" | awk -v n="$hosts" '$1 != "" { printf "%.3f", $1 / n }'
}
machine=$(share_of machine_cpu_s_per_gb "${lines[@]}")
agree=yes
for l in "${lines[@]}"; do
	[ "$(json_field median_s <<<"$l")" = "$median" ] || agree=no
done
[ "$peers" = "$hosts" ] || say "warning: the daemons report $peers peers, $hosts hosts ran"
[ "$agree" = yes ] || say "warning: the hosts report different median times"
# Each host's own median (its round ends when its result is in; median_s's
# when every host's is), host 1 first: how far they lie below median_s
# shows the stragglers.
own=$(for l in "${lines[@]}"; do json_field own_median_s <<<"$l"; done | awk '{ printf "%s%.3f", (NR > 1 ? "," : ""), $1 }')
printf 'summary: hosts=%s rates=%s delay=%s loss=%s tcp=%s size=%s codec=%s schedule=%s rounds=%s median_s=%s own_medians_s=%s algbw_gbps=%s busbw_gbps=%s wire_bytes_per_peer=%s ideal_s=%s efficiency=%s busbw/slowest_link=%s cpu_s_per_gb=%s machine_cpu_s_per_gb=%s hosts_agree=%s wall_s=%s\n' \
	"$hosts" "$(IFS=,; echo "${rate_list[*]}")" "${delay:-0}" "${loss:-0%}" "$tcp_cc" "$size" "$codec" "$schedule" \
	"$rounds" "$median" "${own:--}" "$algbw" "$busbw" "${wire:--}" "${ideal:--}" "${efficiency:--}" \
	"$(awk -v g="$busbw" -v b="$min_bps" 'BEGIN { printf "%.3f\n", g * 1e9 / b }')" "${cpu:--}" "${machine:--}" "$agree" \
	"$((SECONDS - start_s))"

# --- gloo on the same hosts (--gloo) ------------------------------------------------

# ratio A B: A / B to two places, or - when either is unknown.
ratio() {
	awk -v p="$1" -v g="$2" 'BEGIN { if (p > 0 && g > 0) printf "%.2f", p / g; else print "-" }'
}

run_gloo() {
	local i gp=() code=0 g=() line gmed gbus gcpu gmachine
	for ((i = 1; i <= hosts; i++)); do
		timeout -k 5 "$timeout_s" ip netns exec "$(host_ns "$i")" env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
			"$GLOO_PY" "$ROOT/bench/gloo_allreduce.py" --rank $((i - 1)) --world "$hosts" \
			--master "$(host_ip 1):29500" --size-bytes "$size_b" --rounds "$rounds" --timeout "$timeout_s" \
			>"$work/gloo$i.out" 2>"$work/gloo$i.err" </dev/null 9>&- &
		gp[i]=$!
	done
	for ((i = 1; i <= hosts; i++)); do wait "${gp[i]}" || code=$?; done
	if [ "$code" != 0 ]; then
		tail -n 15 "$work"/gloo*.err >&2 || true
		die "the gloo all-reduce failed (exit status $code)"
	fi
	for ((i = 1; i <= hosts; i++)); do
		line=$(grep -E '^[[:space:]]*\{' "$work/gloo$i.out" | tail -n 1 || true)
		[ -n "$line" ] || die "gloo rank $((i - 1)) printed no JSON object"
		line="${line%\}},\"host\":\"h$i\",\"hosts\":$hosts,\"rate\":\"${rate_list[i - 1]}\",\"time\":\"$ts\"}"
		echo "$line"
		[ -z "$out" ] || echo "$line" >>"$out"
		g+=("$line")
	done
	gmed=$(json_field median_s <<<"${g[0]}")
	gbus=$(json_field busbw_gbps <<<"${g[0]}")
	gcpu=$(mean_of cpu_s_per_gb "${g[@]}")
	gmachine=$(share_of machine_cpu_s_per_gb "${g[@]}")
	printf 'gloo: median_s=%s busbw_gbps=%s busbw/slowest_link=%s cpu_s_per_gb=%s cpu_ratio=%s machine_cpu_s_per_gb=%s machine_cpu_ratio=%s busbw_ratio=%s\n' \
		"$gmed" "$gbus" "$(awk -v g="$gbus" -v b="$min_bps" 'BEGIN { printf "%.3f", g * 1e9 / b }')" "$gcpu" \
		"$(ratio "$cpu" "$gcpu")" "${gmachine:--}" "$(ratio "$machine" "$gmachine")" \
		"$(awk -v p="$busbw" -v g="$gbus" 'BEGIN { if (g > 0) printf "%.3f", p / g; else print "-" }')"
}
[ "$gloo" = 0 ] || run_gloo
status=0
