#!/usr/bin/env bash
# Reproduces the accuracy table in the README: 4 peers on loopback train the
# same model for the same number of steps with each codec (scripts/demo.sh per
# run), and one line per run gives the final test accuracy and its difference
# from fp32.
#   MODEL=mlp STEPS=1000 CODECS="none sint8 dyn8 qsgd:bits=4 powersgd:rank=4 acpsgd:rank=4" scripts/accuracy.sh
# The 4 peer identities are generated once and every codec runs with them, so
# the rows differ in the codec, not in the ring order the peer IDs give (ranks,
# data shards, summation order). IDENTITIES=dir keeps them in dir (made on first
# use) to compare several invocations too. Runs still differ a little (about
# 0.1 pp): the link probes may re-plan the ring during a run.
set -euo pipefail
[ -z "${IDENTITIES:-}" ] || { mkdir -p "$IDENTITIES" && IDENTITIES="$(cd "$IDENTITIES" && pwd)"; }
cd "$(dirname "$0")/.."
model="${MODEL:-mlp}"
steps="${STEPS:-1000}"
codecs="${CODECS:-none sint8 dyn8 qsgd:bits=4 powersgd:rank=4 acpsgd:rank=4}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
binary="$tmp/p2ptrain"
go build -o "$binary" ./cmd/p2ptrain
ids="${IDENTITIES:-$tmp/identities}"
mkdir -p "$ids"
for i in 0 1 2 3; do
  [ -e "$ids/$i.key" ] || "$binary" keygen --identity "$ids/$i.key" >"$ids/$i.id"
done
echo "peer identities in $ids: $(cat "$ids"/[0-3].id 2>/dev/null | sed 's/.*\(.\{8\}\)$/…\1/' | tr '\n' ' ')"
base=""
printf '%-18s %-6s %6s %9s %7s %s\n' codec model steps accuracy "Δ(pp)" seconds
for codec in $codecs; do
  start=$SECONDS
  out="$(BINARY="$binary" IDENTITIES="$ids" PEERS=4 STEPS="$steps" MODEL="$model" CODEC="$codec" scripts/demo.sh 2>&1 </dev/null)" || {
    echo "$codec: run failed" >&2; echo "$out" | tail -20 >&2; exit 1; }
  acc="$(echo "$out" | sed -n 's/^peer0: done .*accuracy=\([0-9.]*\).*/\1/p')"
  [ -n "$base" ] || base="$acc"
  awk -v c="$codec" -v m="$model" -v s="$steps" -v a="$acc" -v b="$base" -v t=$((SECONDS - start)) \
    'BEGIN { printf "%-18s %-6s %6s %8.2f%% %+7.2f %d\n", c, m, s, 100*a, 100*(a-b), t }'
done
