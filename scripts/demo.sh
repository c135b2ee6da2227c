#!/usr/bin/env bash
# The p2ptrain demo: installs what is missing (Debian's dataset-fashion-mnist,
# iproute2), builds the binary, and starts a local cluster of peers on loopback
# that trains the mlp on Fashion-MNIST data-parallel with a compressed codec.
# It shows progress while they train, then every peer's final accuracy and
# parameter hash, which agree bit for bit.
#
#   PEERS=4 STEPS=500 CODEC=sint8 MODEL=mlp [BINARY=path] [IDENTITIES=dir] scripts/demo.sh
#
# IDENTITIES names a folder of peer identity files 0.key, 1.key, … (p2ptrain
# keygen --identity); peer I runs with I.key, so repeated runs get the same peer
# IDs, hence the same ring ranks and data shards (until the link probes re-plan
# the ring). Without it every peer gets a fresh identity.
set -euo pipefail
cd "$(dirname "$0")/.."
peers="${PEERS:-4}"
steps="${STEPS:-500}"
codec="${CODEC:-sint8}"
model="${MODEL:-mlp}"

scripts/setup.sh
if [ -n "${BINARY:-}" ]; then
  bin="$BINARY" # a prebuilt binary (scripts/accuracy.sh builds one for all its runs)
else
  echo "== building p2ptrain"
  mkdir -p bin
  go build -o bin/p2ptrain ./cmd/p2ptrain
  bin=bin/p2ptrain
fi

work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# start_peer I [FLAGS...]: runs peer I in the background; stdout in $work/I.out, logs in $work/I.log.
start_peer() {
  local i="$1"; shift
  [ -z "${IDENTITIES:-}" ] || set -- --identity "$IDENTITIES/$i.key" "$@"
  "$bin" join --name "peer$i" --cluster demo --listen /ip4/127.0.0.1/tcp/0 \
    --api 127.0.0.1:0 --mdns=false --log-format json \
    --model "$model" --codec "$codec" --steps "$steps" --min-peers "$peers" \
    "$@" >"$work/$i.out" 2>"$work/$i.log" &
  pids+=("$!")
  for _ in $(seq 100); do
    grep -q '^local API' "$work/$i.out" 2>/dev/null && return
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "peer$i did not start:" >&2; cat "$work/$i.log" >&2; exit 1
}
api_of() { sed -n 's|^local API: http://\(.*\)/status|\1|p' "$work/$1.out"; }

echo "== starting $peers peers on loopback: $model, codec $codec, $steps steps"
start_peer 0
boot="$(grep -m1 '/p2p/' "$work/0.out" | tr -d ' ')"
echo "bootstrap address: $boot"
for i in $(seq 1 $((peers - 1))); do start_peer "$i" --bootstrap "$boot"; done

# Progress: peer0's view, redrawn in place on a terminal, one line every 5 s otherwise.
tty=false; [ -t 1 ] && tty=true
last=0
while true; do
  running=0
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=$((running + 1)); done
  [ "$running" -eq "$peers" ] || break
  line="$("$bin" status --api "$(api_of 0)" 2>/dev/null | grep '^train' || true)"
  ring="$("$bin" status --api "$(api_of 0)" 2>/dev/null | sed -n 's/^ring *//p' || true)"
  if $tty; then
    printf '\r\033[K%s | %s' "${line#train    }" "${ring%%, coordinator*}"
  elif [ $((SECONDS - last)) -ge 5 ]; then
    echo "${line#train    } | ${ring%%, coordinator*}"
    last=$SECONDS
  fi
  sleep 0.5
done
$tty && printf '\r\033[K'

status=0
for i in "${!pids[@]}"; do wait "${pids[$i]}" || status=$?; done
echo "== results"
for i in $(seq 0 $((peers - 1))); do
  printf 'peer%d: %s\n' "$i" "$(grep '^done' "$work/$i.out" || echo "no result; log: $(tail -3 "$work/$i.log")")"
done
hashes="$(grep -h '^done' "$work"/*.out | sed 's/.*param_hash=//' | sort -u | wc -l)"
if [ "$status" -ne 0 ] || [ "$hashes" -ne 1 ] || [ "$(grep -l '^done' "$work"/*.out | wc -l)" -ne "$peers" ]; then
  echo "demo: the peers did not all finish with one parameter hash" >&2
  exit 1
fi
echo "== all $peers peers finished with identical parameters"
