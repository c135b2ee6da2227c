#!/usr/bin/env bash
# Takes the screenshot of the local API's live page that docs/operating.md
# shows: it starts a short local training run of PEERS peers on loopback
# (the mlp on Fashion-MNIST, codec CODEC), waits until peer0 has EVALS
# evaluations in its /history, photographs peer0's page (http://API/) with
# headless chromium at 1400x1000, and stops every process it started.
#
#   [PEERS=3] [CODEC=sint8] [EVALS=6] [OUT=docs/img/page.png] [BINARY=path] scripts/page-screenshot.sh
#
# The peers run under scripts/demo.sh (BINARY: a prebuilt binary; without
# it demo.sh builds bin/p2ptrain). Needs chromium and curl (scripts/setup.sh
# installs chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
peers="${PEERS:-3}"
codec="${CODEC:-sint8}"
evals="${EVALS:-6}"
out="${OUT:-docs/img/page.png}"

for tool in chromium curl; do
  command -v "$tool" >/dev/null 2>&1 || { echo "page-screenshot: $tool is not installed (scripts/setup.sh installs chromium)" >&2; exit 1; }
done

work="$(mktemp -d)"
demo=""
cleanup() {
  # demo.sh stops its peers when it is stopped.
  if [ -n "$demo" ]; then kill "$demo" 2>/dev/null || true; wait "$demo" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# Far more steps than the screenshot needs: the run is stopped once it is taken.
cat >"$work/config.toml" <<'TOML'
[gossip]
heartbeat = "250ms"
[train]
hidden = [256, 256]
batch_size = 64
train_samples = 16384
eval_samples = 1000
eval_every = 40
TOML

echo "== starting $peers peers on loopback (scripts/demo.sh: mlp, codec $codec)"
PEERS="$peers" STEPS=100000 CODEC="$codec" MODEL=mlp CONFIG="$work/config.toml" LOGDIR="$work/run" \
  scripts/demo.sh >"$work/demo.out" 2>&1 &
demo=$!
api=""
for _ in $(seq 1200); do
  api="$(sed -n 's|^local API: http://\(.*\)/status|\1|p' "$work/run/0.out" 2>/dev/null || true)"
  [ -n "$api" ] && break
  kill -0 "$demo" 2>/dev/null || break
  sleep 0.5
done
[ -n "$api" ] || { echo "page-screenshot: peer0 did not start:" >&2; tail -5 "$work/demo.out" >&2; exit 1; }

echo "== waiting for $evals evaluations on peer0 ($api)"
have=0
for _ in $(seq 600); do
  have="$(curl -fsS "http://$api/history" | grep -o '"kind":"eval"' | wc -l || true)"
  [ "$have" -ge "$evals" ] && break
  kill -0 "$demo" 2>/dev/null || { echo "page-screenshot: the run ended early:" >&2; tail -5 "$work/demo.out" >&2; exit 1; }
  sleep 0.5
done
[ "$have" -ge "$evals" ] || { echo "page-screenshot: only $have evaluations after 5 minutes" >&2; exit 1; }

echo "== photographing http://$api/ into $out"
mkdir -p "$(dirname "$out")"
# The page polls once a second; the virtual time budget lets it load its
# history and draw before the picture is taken.
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --user-data-dir="$work/chromium" \
  --window-size=1400,1000 --virtual-time-budget=4000 --screenshot="$out" "http://$api/" >"$work/chromium.log" 2>&1 ||
  { echo "page-screenshot: chromium failed:" >&2; tail -5 "$work/chromium.log" >&2; exit 1; }
[ -s "$out" ] || { echo "page-screenshot: chromium wrote no $out" >&2; tail -5 "$work/chromium.log" >&2; exit 1; }
echo "== $out: $(wc -c <"$out") bytes"
