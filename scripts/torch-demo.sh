#!/usr/bin/env bash
# The PyTorch demo: 4 p2ptrain daemons on loopback, each serving a PyTorch
# process beside it (python/examples/fashion_mnist.py: a small residual CNN
# defined in that file, not a p2ptrain model) over --trainer external. It
# installs what is missing, shows progress, prints every daemon's and every
# script's done line and checks that all 8 hashes agree (scripts/demo.sh
# does the work; its variables apply).
#
#   [PEERS=4] [STEPS=300] [CODEC=sint8] [TORCH_ARGS="--model resnet --width 8 --lr 0.2"] scripts/torch-demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export TRAINER=external PEERS="${PEERS:-4}" STEPS="${STEPS:-300}" CODEC="${CODEC:-sint8}"
export TORCH_ARGS="${TORCH_ARGS:---model resnet --width 8 --lr 0.2}"
exec scripts/demo.sh
