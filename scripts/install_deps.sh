#!/usr/bin/env bash
# Installs the Debian packages bridge needs to build, test and benchmark. Idempotent: packages already present are
# left alone and apt is not even asked to refresh its lists, so a second run takes about a second.
#
# Usage: scripts/install_deps.sh            (as root, or with sudo available)
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev          # LibTorch 1.13: tensors, autograd, c10d (Gloo)
  libgloo-dev           # Gloo headers that c10d's ProcessGroupGloo exposes
  libopenblas0-pthread  # replaces reference BLAS behind libblas.so.3: ~15x faster CPU matmuls
  libopenmpi-dev openmpi-bin  # mpirun launch and the MPI rank/address bootstrap
  libspdlog-dev         # rank-aware logging
  libcxxopts-dev        # command-line parsing
  libgtest-dev libgmock-dev   # unit tests
  libbenchmark-dev      # micro-benchmarks
  python3-torch         # Python reference for parity checks, and torchrun
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install_deps: run as root or install sudo" >&2; exit 1; }
  sudo_cmd=(sudo)
fi

echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
