#!/usr/bin/env bash
# Runs the network-namespace benchmarks on a machine with more cores than test
# hosts, so that every host's daemon, PyTorch process and kernel TCP work has
# cores of its own (on the 2-core development machine four hosts share two).
# The machine at hand for that is the GPU machine (16 cores), which has
# neither Go, nor iproute2, nor a package registry; so, in two halves:
#
#   scripts/many-cores.sh pack DIR   # here: p2ptrain, the netcheck probe,
#                                    # iproute2's ip and tc with the libraries
#                                    # they load, and the Fashion-MNIST files
#   scripts/many-cores.sh run DIR    # there, as root, from the repository root
#
# run puts the packed ip and tc on PATH (through the packed libraries'
# loader path, so the programs they start see no foreign libraries) and, each
# step bounded in time and reported PASS, FAIL or SKIP at the end:
#   1. what the machine has: cores, a network namespace, an htb qdisc;
#   2. bench/netns.sh --check: every link alone, then all at once (4 × 100mbit);
#   3. bench/netns.sh at 4 × 100 Mbit/s, 64 MiB, 5 rounds: onebit and sign
#      (direct schedule), qsgd:bits=4 and sint8 (ring), $REPEATS times (default 1);
#   4. bench/netns.sh at 4 × 1 Gbit/s, fp32, 64 MiB, with a swarm key, beside
#      PyTorch's gloo on the same hosts (--gloo): busbw and CPU per GB;
#   5. bench/torch-bridge.sh --steps $STEPS (default 200): the bridge, the Go
#      trainer and DDP at 4 × 100 Mbit/s (the README's torch table).
# Everything stays inside the scripts' namespaces. $BUDGET (seconds, default
# 480) bounds the whole run: a step that would not finish in what is left is
# skipped; CHECK=0 and TORCH=0 leave steps 2 and 5 out; $PYTHON names a python3 with torch (default: the one on PATH). The summary, the JSON lines, the table and the torch runs' logs
# (torch-logs.tar.xz) go to $RESULTS (default DIR/results).
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/many-cores.sh pack DIR | run DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
dir="$2"

# The iproute2 programs (ss: the benches wait for a daemon's listening
# socket) and the libraries they load that a bare image may lack (not glibc's).
IPROUTE_PROGS="ip tc ss"
IPROUTE_LIBS="libbpf.so.1 libelf.so.1 libmnl.so.0 libbsd.so.0 libcap.so.2 libxtables.so.12 libmd.so.0
  libselinux.so.1 libtirpc.so.3 libpcre2-8.so.0 libgssapi_krb5.so.2 libkrb5.so.3 libk5crypto.so.3
  libcom_err.so.2 libkrb5support.so.0 libkeyutils.so.1"

pack() {
  set -e
  mkdir -p "$dir/bin" "$dir/data" "$dir/iproute2/bin" "$dir/iproute2/lib"
  local tmp
  tmp="$(mktemp -d)"
  CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$tmp/p2ptrain" ./cmd/p2ptrain
  CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$tmp/netcheck" ./bench/netcheck
  tar -C "$tmp" -cJf "$dir/bin/binaries.tar.xz" p2ptrain netcheck
  rm -rf "$tmp"
  local p l
  for p in $IPROUTE_PROGS; do
    cp "$(command -v "$p")" "$dir/iproute2/bin/$p" || { echo "many-cores: $p missing (apt-get install iproute2)" >&2; exit 1; }
  done
  for l in $IPROUTE_LIBS; do
    cp -L "/lib/x86_64-linux-gnu/$l" "$dir/iproute2/lib/" || { echo "many-cores: /lib/x86_64-linux-gnu/$l missing" >&2; exit 1; }
  done
  local src=/usr/share/datasets/fashion-mnist
  [ -d "$src" ] || { echo "many-cores: $src missing (scripts/setup.sh installs it)" >&2; exit 1; }
  cp "$src"/*-ubyte.gz "$dir/data/"
  du -sh "$dir"
}

# shellcheck source=scripts/steps.sh
. scripts/steps.sh # the working directory is the repository root

# probe: the kernel features the benches need, tried in a namespace of their own.
probe() {
  echo "cores: $(nproc); kernel: $(uname -r)"
  ip netns add p2pt-mc-probe || return 1
  local rc=0
  ip netns exec p2pt-mc-probe ip link add mcp0 type veth peer name mcp1 &&
    ip netns exec p2pt-mc-probe tc qdisc add dev mcp0 root handle 1: htb default 1 &&
    ip netns exec p2pt-mc-probe tc class add dev mcp0 parent 1: classid 1:1 htb rate 100mbit &&
    ip netns exec p2pt-mc-probe ip link add br0 type bridge || rc=1
  ip netns del p2pt-mc-probe
  return "$rc"
}

run() {
  BUDGET=${BUDGET:-480}
  steps_start=$SECONDS
  dir="$(cd "$dir" && pwd)"
  local res="${RESULTS:-$dir/results}"
  mkdir -p "$res" "$dir/path" "$dir/run"
  res="$(cd "$res" && pwd)"
  tar -C "$dir/run" -xJf "$dir/bin/binaries.tar.xz" || { echo "many-cores: cannot unpack $dir/bin/binaries.tar.xz" >&2; return 1; }
  local p
  for p in $IPROUTE_PROGS; do
    printf '#!/bin/sh\nexec /lib64/ld-linux-x86-64.so.2 --library-path %s %s "$@"\n' \
      "$dir/iproute2/lib" "$dir/iproute2/bin/$p" >"$dir/path/$p"
    chmod +x "$dir/path/$p"
  done
  export PATH="$dir/path:$PATH" P2PTRAIN_DATA="$dir/data" NETCHECK="$dir/run/netcheck"
  local bin="$dir/run/p2ptrain" py
  py="${PYTHON:-$(command -v python3)}"

  if ! step "probe: namespaces, veth, bridge, htb" 30 "$0" probe "$dir"; then
    echo "many-cores: this machine cannot build the test network; nothing else runs"
  else
    [ "${CHECK:-1}" = 0 ] || step "netns --check, 4 x 100mbit" 60 bench/netns.sh --check --hosts 4 --rate 100mbit
    local c s r
    for r in $(seq "${REPEATS:-1}"); do
      for c in onebit:direct sign:direct qsgd:bits=4:ring sint8:ring; do
        s="${c##*:}"
        c="${c%:*}"
        step "netns $c ($s), 4 x 100mbit, 64MiB, run $r" 90 \
          bench/netns.sh --binary "$bin" --hosts 4 --rate 100mbit --codec "$c" --schedule "$s" --rounds 5 --out "$res/netns.jsonl"
      done
    done
    step "netns fp32, 4 x 1gbit, 64MiB, beside gloo" 120 \
      env GLOO_PYTHON="$py" bench/netns.sh --binary "$bin" --hosts 4 --rate 1gbit --codec fp32 --rounds 5 --gloo --out "$res/netns.jsonl"
    [ "${TORCH:-1}" = 0 ] || step "torch-bridge, 4 x 100mbit, ${STEPS:-200} steps" 420 \
      env BINARY="$bin" PYTHON="$py" bench/torch-bridge.sh --steps "${STEPS:-200}" --markdown "$res/torch-table.md" --logdir "$dir/torch-logs"
    [ ! -d "$dir/torch-logs" ] || tar -C "$dir" -cJf "$res/torch-logs.tar.xz" torch-logs
  fi

  summarize "$(nproc) cores" "$res/summary.txt"
}

case "$1" in
  pack) pack ;;
  run) run ;;
  probe) probe ;; # run's first step, in a process of its own
  *) usage ;;
esac
