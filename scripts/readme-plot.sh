#!/usr/bin/env bash
# scripts/readme-plot.sh — the README's training-curve figure: trains the mlp
# on Fashion-MNIST with a local cluster on loopback once per codec (through
# scripts/demo.sh: same peers, seed, steps and data shards; only the codec
# differs), each peer writing a metrics file, then draws peer 0's file of
# every run with `p2ptrain plot` into OUT.svg and OUT.png.
#
#   [PEERS=3] [STEPS=300] [CODECS="none sint8"] [EVAL_EVERY=50] [OUT=docs/img/curves-codecs] scripts/readme-plot.sh
#
# KEEP=dir keeps every run's logs and metrics files there (dir/CODEC/…).
# Everything it starts is stopped when it ends or is interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
peers="${PEERS:-3}"
steps="${STEPS:-300}"
read -r -a codecs <<<"${CODECS:-none sint8}"
eval_every="${EVAL_EVERY:-50}"
out="${OUT:-docs/img/curves-codecs}"

work="${KEEP:-$(mktemp -d)}"
mkdir -p "$work"
child=""
cleanup() {
  [ -z "$child" ] || kill "$child" 2>/dev/null || true # demo.sh stops its peers
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "== building p2ptrain"
go build -o "$work/p2ptrain" ./cmd/p2ptrain
bin="$work/p2ptrain"

# The same identities in every run: the same ring ranks, hence data shards.
mkdir -p "$work/ids"
for i in $(seq 0 $((peers - 1))); do "$bin" keygen --identity "$work/ids/$i.key" >/dev/null; done
cat >"$work/run.toml" <<EOF
[train]
eval_every = $eval_every
EOF

files=()
for codec in "${codecs[@]}"; do
  dir="$work/${codec//[^A-Za-z0-9._-]/_}"
  echo "== codec $codec: $peers peers, $steps steps"
  PEERS="$peers" STEPS="$steps" CODEC="$codec" MODEL=mlp BINARY="$bin" IDENTITIES="$work/ids" \
    CONFIG="$work/run.toml" LOGDIR="$dir/logs" METRICS="$dir" scripts/demo.sh &
  child=$!
  wait "$child"
  child=""
  files+=(--label "$codec" "$dir/0.jsonl")
done

mkdir -p "$(dirname "$out")"
versus="$(printf ' vs %s' "${codecs[@]}")"
title="mlp on Fashion-MNIST, $peers peers on loopback, $steps steps: codec ${versus# vs }"
for ext in svg png; do
  "$bin" plot "${files[@]}" --title "$title" -o "$out.$ext"
done
echo "== wrote $out.svg and $out.png"
