#!/usr/bin/env bash
# Reproduces the accuracy table in the README: 4 peers on loopback train the
# same model for the same number of steps with each codec (scripts/demo.sh per
# run), and one line per run gives the final test accuracy and its difference
# from fp32.
#   MODEL=mlp STEPS=1000 CODECS="none sint8 dyn8 qsgd:bits=4 powersgd:rank=4 acpsgd:rank=4" scripts/accuracy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
model="${MODEL:-mlp}"
steps="${STEPS:-1000}"
codecs="${CODECS:-none sint8 dyn8 qsgd:bits=4 powersgd:rank=4 acpsgd:rank=4}"
binary="$(mktemp -d)/p2ptrain"
go build -o "$binary" ./cmd/p2ptrain
base=""
printf '%-18s %-6s %6s %9s %7s %s\n' codec model steps accuracy "Δ(pp)" seconds
for codec in $codecs; do
  start=$SECONDS
  out="$(BINARY="$binary" PEERS=4 STEPS="$steps" MODEL="$model" CODEC="$codec" scripts/demo.sh 2>&1 </dev/null)" || {
    echo "$codec: run failed" >&2; echo "$out" | tail -20 >&2; exit 1; }
  acc="$(echo "$out" | sed -n 's/^peer0: done .*accuracy=\([0-9.]*\).*/\1/p')"
  [ -n "$base" ] || base="$acc"
  awk -v c="$codec" -v m="$model" -v s="$steps" -v a="$acc" -v b="$base" -v t=$((SECONDS - start)) \
    'BEGIN { printf "%-18s %-6s %6s %8.2f%% %+7.2f %d\n", c, m, s, 100*a, 100*(a-b), t }'
done
