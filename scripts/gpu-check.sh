#!/usr/bin/env bash
# Checks p2ptrain on a machine with an NVIDIA GPU, in two halves, so that the
# GPU machine needs neither Go nor a package registry:
#
#   scripts/gpu-check.sh pack DIR    # here: the binaries and the dataset into DIR
#   scripts/gpu-check.sh run DIR     # on the GPU machine, from the repository root
#
# pack builds p2ptrain and the test binaries of gpu/cuda and gpu/cuda/cudadev
# (stripped, xz-compressed) and copies Debian's Fashion-MNIST files.
# run uses the python3 on PATH (it must import torch with CUDA) and does, each
# step bounded in time and reported PASS or FAIL at the end:
#   1. what the machine has: nvidia-smi, torch's view, `p2ptrain devices`;
#   2. the CUDA device's Go tests with P2PTRAIN_REQUIRE_GPU=1 (a missing GPU
#      fails them): the real driver's report, the conformance suite, the
#      kernels against the CPU device, training against the CPU device;
#   3. the Python package's tests with P2PTRAIN_REQUIRE_GPU=1 (test_cuda.py:
#      a model on the GPU through the Collective);
#   4. `p2ptrain bench train` for the mlp, the cnn and the gpt on cpu and cuda;
#   5. the demo with the built-in trainer on the GPU (4 peers, devices cuda);
#   6. the demo with a mixed cluster: peers 0 and 2 on the GPU, 1 and 3 on
#      the CPU (cnn), which must still end with one parameter hash;
#   7. the PyTorch demo with the example's residual CNN on the GPU (4 daemons,
#      4 PyTorch processes with --device cuda);
#   8. scripts/bridge-overhead.sh on the CPU and on the GPU: the bridge's own
#      cost per step with one peer;
#   9. `p2ptrain plan` timing the layers and the processor's work on the GPU
#      and on the CPU, and 2 peers choosing a layout with
#      train.pipeline_stages = auto on the GPU (a gpt on the repository's docs).
# Logs of the demos go to $GPU_LOGS (default DIR/logs).
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/gpu-check.sh pack DIR | run DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
dir="$2"

pack() {
  set -e
  mkdir -p "$dir/data" "$dir/bin"
  local tmp
  tmp="$(mktemp -d)"
  go build -trimpath -ldflags="-s -w" -o "$tmp/p2ptrain" ./cmd/p2ptrain
  go test -c -trimpath -ldflags="-s -w" -o "$tmp/cuda.test" ./gpu/cuda
  go test -c -trimpath -ldflags="-s -w" -o "$tmp/cudadev.test" ./gpu/cuda/cudadev
  tar -C "$tmp" -cJf "$dir/bin/binaries.tar.xz" p2ptrain cuda.test cudadev.test
  rm -rf "$tmp"
  local src=/usr/share/datasets/fashion-mnist
  [ -d "$src" ] || { echo "gpu-check: $src missing (scripts/setup.sh installs it)" >&2; exit 1; }
  cp "$src"/*-ubyte.gz "$dir/data/"
  du -sh "$dir"
}

# shellcheck source=scripts/steps.sh
. scripts/steps.sh # the working directory is the repository root

run() {
  local bin="$dir/run"
  mkdir -p "$bin"
  tar -C "$bin" -xJf "$dir/bin/binaries.tar.xz" || { echo "gpu-check: cannot unpack $dir/bin/binaries.tar.xz" >&2; exit 1; }
  bin="$(cd "$bin" && pwd)"
  export P2PTRAIN_DATA
  P2PTRAIN_DATA="$(cd "$dir/data" && pwd)"
  local logs="${GPU_LOGS:-$dir/logs}"
  mkdir -p "$logs"
  logs="$(cd "$logs" && pwd)" # the daemons' sockets must have absolute paths
  export P2PTRAIN_CUDA_CACHE="$dir/cuda-cache"

  step "nvidia-smi" 60 nvidia-smi
  step "torch sees the GPU" 120 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0)); assert torch.cuda.is_available()'
  step "p2ptrain devices" 60 "$bin/p2ptrain" devices
  step "go test ./gpu/cuda (real driver)" 300 \
    env P2PTRAIN_REQUIRE_GPU=1 bash -c "cd gpu/cuda && '$bin/cuda.test' -test.v -test.count=1"
  step "go test ./gpu/cuda/cudadev (real GPU)" 300 \
    env P2PTRAIN_REQUIRE_GPU=1 bash -c "cd gpu/cuda/cudadev && '$bin/cudadev.test' -test.v -test.count=1"
  step "python tests (test_cuda.py on the GPU)" 300 \
    env P2PTRAIN_REQUIRE_GPU=1 PYTHONPATH=python python3 -m unittest discover -v -s python/tests -t python
  step "bench train mlp: cpu vs cuda" 300 \
    "$bin/p2ptrain" bench train --devices cpu --devices cuda --model mlp --batch-size 256 --steps 50
  step "bench train cnn: cpu vs cuda" 300 \
    "$bin/p2ptrain" bench train --devices cpu --devices cuda --model cnn --batch-size 64 --steps 20
  step "bench train gpt: cpu vs cuda" 300 \
    "$bin/p2ptrain" bench train --devices cpu --devices cuda --model gpt --batch-size 8 --steps 5 --data synthetic
  for d in cuda:0 cpu; do
    step "plan on $d (processor terms)" 120 \
      "$bin/p2ptrain" plan --device "$d" --preset small --peers 4 --link 100mbit --batch 32 --micro 4 --optimizer adamw --top 4 --time-batch 2
  done
  sed -e 's|^data = ""|data = "docs"\ndata_ext = [".md"]|' -e 's|^check_every = 25|check_every = 10\npipeline_stages = "auto"\nmicro_batches = 2|' \
    examples/gpt-small.toml >"$logs/auto.toml"
  step "demo: pipeline_stages = auto on the GPU (gpt)" 180 \
    env SETUP=0 BINARY="$bin/p2ptrain" CONFIG="$logs/auto.toml" LOGDIR="$logs/auto" PEERS=2 STEPS=30 PEER_DEVICES=cuda \
    MODEL=gpt scripts/demo.sh
  printf '[train]\ndevices = ["cuda"]\n' >"$logs/cuda.toml"
  step "demo: 4 peers training on the GPU" 300 \
    env SETUP=0 BINARY="$bin/p2ptrain" CONFIG="$logs/cuda.toml" LOGDIR="$logs/demo" PEERS=4 STEPS="${STEPS:-300}" \
    MODEL=mlp scripts/demo.sh
  step "demo: 2 peers on the GPU, 2 on the CPU" 300 \
    env SETUP=0 BINARY="$bin/p2ptrain" PEER_DEVICES="cuda cpu" LOGDIR="$logs/mixed" PEERS=4 STEPS=200 \
    MODEL=cnn scripts/demo.sh
  step "torch demo: 4 PyTorch processes on the GPU" 300 \
    env SETUP=0 BINARY="$bin/p2ptrain" PYTHON=python3 LOGDIR="$logs/torch" PEERS=4 STEPS="${STEPS:-300}" \
    TORCH_ARGS="--model resnet --width 8 --lr 0.2 --device cuda" scripts/torch-demo.sh
  for d in cpu cuda; do
    step "bridge overhead, model on $d" 300 \
      env DEVICE="$d" BINARY="$bin/p2ptrain" PYTHON=python3 REPEATS=3 STEPS=400 scripts/bridge-overhead.sh
  done

  summarize
}

case "$1" in
  pack) pack ;;
  run) run ;;
  *) usage ;;
esac
