#!/usr/bin/env bash
# The p2ptrain demo: installs what is missing (Debian's dataset-fashion-mnist,
# iproute2), builds the binary, and starts a local cluster of peers on loopback
# that trains the mlp on Fashion-MNIST data-parallel with a compressed codec.
# It shows progress while they train, then every peer's final accuracy and
# parameter hash, which agree bit for bit.
#
#   PEERS=4 STEPS=500 CODEC=sint8 MODEL=mlp [BINARY=path] [IDENTITIES=dir] [CONFIG=file] [LOGDIR=dir] [METRICS=dir] scripts/demo.sh
#
# CONFIG is a config file every peer reads (the flags above override it);
# LOGDIR keeps every peer's stdout (I.out) and JSON log (I.log) there;
# METRICS names a folder where peer I writes its metrics file I.jsonl
# (join --metrics-file; p2ptrain plot draws them).
#
# TRAINER=external runs the PyTorch bridge instead: every daemon all-reduces
# for a PyTorch process beside it (python/examples/fashion_mnist.py in
# Debian's python3, with the arguments in TORCH_ARGS; default: the MLP of
# the same shape), and both print the same hash. scripts/torch-demo.sh runs
# it with the example's own residual CNN.
#
# PEER_DEVICES gives the peers their train.devices in turn, a comma-separated
# list each: "cuda cpu:0,cpu:1" puts peer 0 on the GPU, peer 1 on two CPU
# devices, peer 2 on the GPU, ... (a cluster
# that mixes devices; each device's gradients differ in rounding, the
# averaged update is the same, so the hashes still agree).
#
# SETUP=0 skips scripts/setup.sh, for a machine that already has what the
# demo needs but no package registry (scripts/gpu-check.sh on a GPU machine);
# PYTHON names the interpreter of the PyTorch processes (default: Debian's
# /usr/bin/python3).
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
trainer="${TRAINER:-builtin}"

[ "${SETUP:-1}" = 0 ] || scripts/setup.sh
if [ -n "${BINARY:-}" ]; then
  bin="$BINARY" # a prebuilt binary (scripts/accuracy.sh builds one for all its runs)
else
  echo "== building p2ptrain"
  mkdir -p bin
  go build -o bin/p2ptrain ./cmd/p2ptrain
  bin=bin/p2ptrain
fi

work="${LOGDIR:-$(mktemp -d)}"
mkdir -p "$work"
[ -z "${METRICS:-}" ] || mkdir -p "$METRICS"
pids=()
scripts=()
cleanup() {
  for pid in "${pids[@]}" "${scripts[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${LOGDIR:-}" ] || rm -rf "$work"
}
trap cleanup EXIT INT TERM

# start_peer I [FLAGS...]: runs peer I in the background; stdout in $work/I.out, logs in $work/I.log.
start_peer() {
  local i="$1"; shift
  [ -z "${IDENTITIES:-}" ] || set -- --identity "$IDENTITIES/$i.key" "$@"
  [ -z "${CONFIG:-}" ] || set -- --config "$CONFIG" "$@"
  [ -z "${METRICS:-}" ] || set -- --metrics-file "$METRICS/$i.jsonl" "$@"
  if [ -n "${PEER_DEVICES:-}" ]; then
    local devs
    read -r -a devs <<<"$PEER_DEVICES"
    local mine="${devs[i % ${#devs[@]}]}"
    set -- --set "train.devices=[\"${mine//,/\",\"}\"]" "$@"
  fi
  [ "$trainer" = builtin ] || set -- --trainer external --socket "$work/$i.sock" "$@"
  "$bin" join --name "peer$i" --cluster demo --listen /ip4/127.0.0.1/tcp/0 \
    --api 127.0.0.1:0 --mdns=false --log-format json \
    --model "$model" --codec "$codec" --steps "$steps" --min-peers "$peers" \
    "$@" >"$work/$i.out" 2>"$work/$i.log" &
  pids+=("$!")
  for _ in $(seq 100); do
    if grep -q '^local API' "$work/$i.out" 2>/dev/null; then
      [ "$trainer" = builtin ] || start_script "$i"
      return
    fi
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "peer$i did not start:" >&2; cat "$work/$i.log" >&2; exit 1
}
# start_script I: the PyTorch process beside daemon I (TRAINER=external).
start_script() {
  # shellcheck disable=SC2086 # TORCH_ARGS is a list of arguments
  PYTHONPATH=python "${PYTHON:-/usr/bin/python3}" python/examples/fashion_mnist.py --socket "$work/$1.sock" \
    ${TORCH_ARGS:---model mlp} >"$work/$1.py.out" 2>"$work/$1.py.log" &
  scripts+=("$!")
}
api_of() { sed -n 's|^local API: http://\(.*\)/status|\1|p' "$work/$1.out"; }

if [ "$trainer" = builtin ]; then
  echo "== starting $peers peers on loopback: $model, codec $codec, $steps steps"
else
  echo "== starting $peers daemons on loopback, each with a PyTorch process (python/examples/fashion_mnist.py ${TORCH_ARGS:---model mlp}): codec $codec, $steps steps"
fi
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
for pid in "${pids[@]}" "${scripts[@]}"; do wait "$pid" || status=$?; done
echo "== results"
for i in $(seq 0 $((peers - 1))); do
  printf 'peer%d: %s\n' "$i" "$(grep '^done' "$work/$i.out" || echo "no result; log: $(tail -3 "$work/$i.log")")"
  [ "$trainer" = builtin ] || printf '  its PyTorch process: %s\n' "$(grep '^done' "$work/$i.py.out" || echo "no result: $(tail -3 "$work/$i.py.log")")"
done
# One hash per stage, daemons and scripts alike: with train.pipeline_stages the
# done lines name the stage each peer holds, and only a stage's replicas agree.
pairs="$(grep -h '^done' "$work"/*.out | awk '{ s = "-"; h = ""; for (i = 1; i <= NF; i++) { if ($i ~ /^stage=/) s = $i; if ($i ~ /^param_hash=/) h = $i }; print s, h }' | sort -u)"
hashes="$(printf '%s\n' "$pairs" | grep -c .)"
stages="$(printf '%s\n' "$pairs" | cut -d ' ' -f 1 | sort -u | grep -c .)"
want=$peers; [ "$trainer" = builtin ] || want=$((2 * peers))
if [ "$status" -ne 0 ] || [ "$hashes" -ne "$stages" ] || [ "$(grep -l '^done' "$work"/*.out | wc -l)" -ne "$want" ]; then
  echo "demo: the peers did not all finish with one parameter hash (per pipeline stage):" >&2
  printf '  %s\n' "$pairs" >&2
  exit 1
fi
if [ "$stages" -gt 1 ]; then
  echo "== all $peers peers finished; the replicas of each of the $stages pipeline stages hold identical parameters"
else
  echo "== all $peers peers finished with identical parameters"
fi
