#!/usr/bin/env bash
# Installs what p2ptrain's demo and tests need on a Debian machine with Go:
# the Fashion-MNIST dataset package, iproute2 (network namespaces, tc), and
# gcc and g++ (the CUDA device's tests build stand-in CUDA libraries with them;
# without them those tests skip), Debian's python3-torch with OpenBLAS (the
# PyTorch bridge),
# and chromium (headless, for the local API page's test and screenshot).
# Safe to run repeatedly; installs only what is missing.
set -euo pipefail

need=()
dpkg -s dataset-fashion-mnist >/dev/null 2>&1 || need+=(dataset-fashion-mnist)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v iptables >/dev/null 2>&1 || need+=(iptables) # bench/nat.sh: the NAT routers
command -v curl >/dev/null 2>&1 || need+=(curl) # bench/nat.sh: the peers' local API
command -v jq >/dev/null 2>&1 || need+=(jq)     # bench/nat.sh (run by CI), bench/pipeline.sh: JSON figures
command -v gcc >/dev/null 2>&1 || need+=(gcc)
command -v g++ >/dev/null 2>&1 || need+=(g++)
# The PyTorch bridge's tests and demo: Debian's python3 with torch 1.13 (CPU).
/usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || need+=(python3 python3-torch)
# Debian's torch calls whichever libblas.so.3 the alternatives system names, and
# python3-torch alone pulls in the reference BLAS: about 10x slower GEMMs (an MLP
# step of 20 ms instead of 2), which would make every PyTorch figure (the bridge,
# the DDP baseline) measure the BLAS. OpenBLAS (OpenMP build, so that
# torch.set_num_threads governs it too) takes over the alternative when installed.
dpkg -s libopenblas0-openmp >/dev/null 2>&1 || need+=(libopenblas0-openmp)
command -v chromium >/dev/null 2>&1 || need+=(chromium)

if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "setup: please install as root: apt-get install ${need[*]}" >&2
      exit 1
    fi
  fi
  echo "setup: installing ${need[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

command -v go >/dev/null 2>&1 || { echo "setup: Go is not on PATH (p2ptrain needs Go 1.26)" >&2; exit 1; }
go mod download
