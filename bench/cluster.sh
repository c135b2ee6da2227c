# bench/cluster.sh — running p2ptrain daemons on the test hosts of
# bench/netns.sh, for the bench scripts that train on them (torch-bridge.sh,
# lm.sh). Source it after bench/lib.sh, with these set:
#   ROOT PREFIX SUBNET PORT  the repository, the namespaces' prefix (p2pt), the hosts'
#                            subnet (10.77.0) and the daemons' port
#   hosts timeout_s wait_s logdir steps   from the script's options (logdir "" : a
#                            temporary work directory, removed after a successful run)
#   WORK_NAME                the temporary work directory's name (/tmp/WORK_NAME.XXXXXX)
#   CLUSTER_TAG              the daemons' --cluster is CLUSTER_TAG-RUN
#   BINARY                   (optional) the p2ptrain binary to run; without it cluster_up
#                            builds bin/p2ptrain
#   DAEMON_CPUS              (optional) an array: host i's daemon runs on CPU
#                            ${DAEMON_CPUS[i-1]} (taskset -c), so from its start Go sees one core
# It sets work, BIN, boot, pids and status (set status=0 when the script
# succeeded), and traps EXIT/INT/TERM: every process it started is killed and
# the namespaces are removed, but only when cluster_up made them (when p2pt-*
# namespaces exist at the start, another run's, it waits --wait seconds or
# fails, and never touches them).

host_ns() { echo "$PREFIX-h$1"; }
host_ip() { echo "$SUBNET.$((10 + $1))"; }
our_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-(h[0-9]+|br|probe)\$" || true; }

start_s=$SECONDS
status=1
built=0
pids=()
work_dir "$WORK_NAME"

kill_ours() {
	local p
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
}

on_exit() {
	local rc=$?
	trap - EXIT INT TERM
	[ "$status" = 0 ] || [ "$rc" = 0 ] || status=$rc
	kill_ours
	if [ "$built" = 1 ]; then
		"$ROOT/bench/netns.sh" --cleanup >/dev/null 2>&1 || say "bench/netns.sh --cleanup failed; run it by hand"
	fi
	if { [ "$status" = 0 ] && [ "$keep_work" = 0 ]; } || [ -z "$(ls -A "$work")" ]; then
		[ "$keep_work" = 1 ] || rm -rf "$work"
	else
		say "logs in $work"
	fi
	exit "$status"
}
trap on_exit EXIT
trap 'say "interrupted"; status=130; exit 130' INT
trap 'say "terminated"; status=143; exit 143' TERM

# cluster_up NETNS-FLAGS...: waits for another run's namespaces to go (--wait),
# builds bin/p2ptrain, builds the hosts (bench/netns.sh --up --hosts N
# NETNS-FLAGS), and makes the swarm key and every host's identity (boot is
# host 1's multiaddr; CLUSTER_TCP the hosts' TCP congestion control).
cluster_up() {
	local left deadline i
	left=$(our_namespaces | paste -sd ' ')
	if [ -n "$left" ]; then
		[ "$wait_s" -gt 0 ] || die "namespaces $left exist (another run uses them; bench/netns.sh --cleanup removes leftovers); --wait S waits for them"
		say "namespaces $left exist: waiting up to ${wait_s}s for them to go"
		deadline=$((SECONDS + wait_s))
		while [ -n "$(our_namespaces)" ]; do
			[ "$SECONDS" -lt "$deadline" ] || die "namespaces $(our_namespaces | paste -sd ' ') still exist after ${wait_s}s"
			sleep 20
		done
	fi
	if [ -n "${BINARY:-}" ]; then
		BIN=$BINARY # the script's --binary: run it as it is
	else
		say "building bin/p2ptrain"
		(cd "$ROOT" && timeout 600 go build -o bin/p2ptrain ./cmd/p2ptrain) || die "go build ./cmd/p2ptrain failed"
		BIN=$ROOT/bin/p2ptrain
	fi
	built=1
	"$ROOT/bench/netns.sh" --up --hosts "$hosts" "$@" 2>"$work/netns.err" ||
		{ cat "$work/netns.err" >&2; die "bench/netns.sh --up failed"; }
	# The hosts' TCP congestion control, from netns.sh's header ("..., tcp reno; logs in ...").
	CLUSTER_TCP=$(sed -nE 's/.*, tcp ([^;]+);.*/\1/p' "$work/netns.err" | head -n 1)
	rm -f "$work/swarm.key" "$work"/h*.identity # a cluster_up before this one made them
	"$BIN" keygen --swarm-key "$work/swarm.key" >/dev/null 2>&1 || die "p2ptrain keygen --swarm-key failed"
	local ids=()
	for ((i = 1; i <= hosts; i++)); do
		ids+=("$("$BIN" keygen --identity "$work/h$i.identity")") || die "p2ptrain keygen --identity failed"
	done
	boot="/ip4/$(host_ip 1)/tcp/$PORT/p2p/${ids[0]}"
}

# cluster_down: removes the hosts (another cluster_up may follow).
cluster_down() {
	kill_ours
	"$ROOT/bench/netns.sh" --cleanup >/dev/null 2>&1 || die "bench/netns.sh --cleanup failed"
	built=0
}

# bg NAME HOST CMD...: runs CMD in host's namespace, bounded by the run's timeout,
# stdout/stderr to $work/NAME.out/.err; its pid is appended to pids.
bg() {
	local name=$1 i=$2
	shift 2
	echo "ip netns exec $(host_ns "$i") $*" >"$work/$name.cmd"
	timeout -k 5 "$timeout_s" ip netns exec "$(host_ns "$i")" "$@" >"$work/$name.out" 2>"$work/$name.err" </dev/null &
	pids+=($!)
}

show_tail() { # name
	say "--- $1 stderr, last lines:"
	tail -n 12 "$work/$1.err" >&2 || true
	say "--- $1 stdout, last lines:"
	tail -n 5 "$work/$1.out" >&2 || true
}

# wait_all NAME...: waits for every process in pids (their log names in order);
# when one fails, the others are stopped and the run fails.
wait_all() {
	local names=("$@") n=${#pids[@]} k code failed="" done_n=0
	local -A rc=()
	while [ "$done_n" -lt "$n" ]; do
		for ((k = 0; k < n; k++)); do
			[ -z "${rc[$k]:-}" ] || continue
			kill -0 "${pids[k]}" 2>/dev/null && continue
			code=0
			wait "${pids[k]}" || code=$?
			rc[$k]=$code
			done_n=$((done_n + 1))
			[ "$code" = 0 ] || [ -n "$failed" ] || failed=$k
		done
		[ -z "$failed" ] || break
		sleep 0.3
	done
	if [ -n "$failed" ]; then
		code=${rc[$failed]}
		show_tail "${names[failed]}"
		kill_ours
		if [ "$code" = 124 ] || [ "$code" = 137 ]; then
			die "${names[failed]} still running after ${timeout_s}s (timeout)"
		fi
		die "${names[failed]} failed: exit status $code"
	fi
	pids=()
}

# quiesce: nothing of the previous run may still run on a host (a daemon
# lingering for its peers would take CPU from the next run).
quiesce() {
	local i t p
	for ((t = 0; t < 50; t++)); do
		p=""
		for ((i = 1; i <= hosts; i++)); do p+=$(ip netns pids "$(host_ns "$i")" 2>/dev/null || true); done
		[ -n "$p" ] || return 0
		sleep 0.3
	done
	for ((i = 1; i <= hosts; i++)); do
		p=$(ip netns pids "$(host_ns "$i")" 2>/dev/null || true)
		# shellcheck disable=SC2086 # one pid per word; only this script starts processes there
		[ -z "$p" ] || kill -KILL $p 2>/dev/null || true
	done
}

# start_daemons RUN CONFIG FLAGS...: a daemon on every host, host 1 first (the
# others once it listens); log names RUN-hI-d; {host} in FLAGS becomes hI.
start_daemons() {
	local run=$1 cfg=$2 i t args
	shift 2
	for ((i = 1; i <= hosts; i++)); do
		args=(join --config "$cfg" --listen "/ip4/$(host_ip "$i")/tcp/$PORT" --swarm-key "$work/swarm.key"
			--identity "$work/h$i.identity" --name "h$i" --cluster "$CLUSTER_TAG-$run" --mdns=false
			--api 127.0.0.1:7420 --log-format json --steps "$steps" --min-peers "$hosts" "${@//\{host\}/h$i}")
		[ "$i" = 1 ] || args+=(--bootstrap "$boot")
		if [ -n "${DAEMON_CPUS[*]:-}" ]; then
			bg "$run-h$i-d" "$i" taskset -c "${DAEMON_CPUS[i - 1]}" "$BIN" "${args[@]}"
		else
			bg "$run-h$i-d" "$i" "$BIN" "${args[@]}"
		fi
		if [ "$i" = 1 ]; then
			for ((t = 0; t < 150; t++)); do
				ip netns exec "$(host_ns 1)" ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q . && break
				kill -0 "${pids[0]}" 2>/dev/null || { show_tail "$run-h1-d"; die "$run: the daemon on h1 exited at start"; }
				sleep 0.2
			done
		fi
	done
}

# progress_ts FILE STEP: the "ts" of the first JSON progress line of STEP.
progress_ts() {
	awk -v s="\"step\":$2," 'index($0, "\"msg\":\"progress\"") && index($0, s) {
		if (match($0, /"ts":"[^"]+"/)) print substr($0, RSTART + 6, RLENGTH - 7); exit }' "$1"
}

