#!/usr/bin/env bash
# The p2ptrain demo: installs what is missing, builds the binary, starts a local
# cluster of peers on loopback and shows them agreeing on a ring.
#   PEERS=3 scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
peers="${PEERS:-3}"

scripts/setup.sh
echo "== building p2ptrain"
mkdir -p bin
go build -o bin/p2ptrain ./cmd/p2ptrain

work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# start_peer I [FLAGS...]: runs peer I in the background; its stdout goes to $work/I.out.
start_peer() {
  local i="$1"; shift
  bin/p2ptrain join --name "peer$i" --cluster demo --listen /ip4/127.0.0.1/tcp/0 \
    --api 127.0.0.1:0 --mdns=false "$@" >"$work/$i.out" 2>"$work/$i.log" &
  pids+=("$!")
  for _ in $(seq 100); do
    grep -q '^local API' "$work/$i.out" 2>/dev/null && return
    sleep 0.1
  done
  echo "peer$i did not start:" >&2; cat "$work/$i.log" >&2; exit 1
}
api_of() { sed -n 's|^local API: http://\(.*\)/status|\1|p' "$work/$1.out"; }

echo "== starting $peers peers on loopback"
start_peer 0
boot="$(grep -m1 '/p2p/' "$work/0.out" | tr -d ' ')"
echo "bootstrap address: $boot"
for i in $(seq 1 $((peers - 1))); do start_peer "$i" --bootstrap "$boot"; done

echo "== waiting for every peer to show the same ring"
for _ in $(seq 100); do
  rings=""
  for i in $(seq 0 $((peers - 1))); do
    rings+="$(bin/p2ptrain status --api "$(api_of "$i")" --json | tr -d ' \n' | sed -n 's/.*"ring":{\([^}]*\)}.*/\1/p')"$'\n'
  done
  if [ "$(printf '%s' "$rings" | sort -u | wc -l)" -eq 1 ] && grep -q "\"order\":\[\(\"[^\"]*\",\)\{$((peers - 1))\}\"" <<<"$rings"; then
    break
  fi
  sleep 0.2
done
for i in $(seq 0 $((peers - 1))); do
  echo "--- peer$i"
  bin/p2ptrain status --api "$(api_of "$i")"
done
if [ "$(printf '%s' "$rings" | sort -u | wc -l)" -ne 1 ]; then
  echo "demo: peers did not agree on a ring" >&2; exit 1
fi
echo "== all $peers peers agree on the ring above; stopping them (each announces its departure)"
