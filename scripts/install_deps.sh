#!/usr/bin/env bash
# Installs the Debian packages bridge needs to build, test and benchmark, then the Python tools venv (<repo>/.venv)
# the tests read TensorBoard files with. Idempotent: packages already present are left alone and apt is not even asked
# to refresh its lists, and an existing venv that already has its packages is not touched, so a second run takes
# about a second.
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
  libyaml-cpp-dev       # bridge-pretrain's YAML recipes and --print-config
  libgtest-dev libgmock-dev   # unit tests
  libbenchmark-dev      # micro-benchmarks
  nlohmann-json3-dev    # JSON Lines metric writer, JSON input of bridge-preprocess-data (header-only)
  python3-torch         # Python reference for parity checks, and torchrun
  python3-venv          # the tools venv below
)

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The venv with the independent readers the tests compare against (tensorboard's EventAccumulator). It sees the
# system site-packages so that Debian's torch and numpy stay usable from it.
install_tools_venv() {
  local venv="$repo_root/.venv"
  if [[ -x "$venv/bin/python3" ]] && "$venv/bin/python3" -c "import tensorboard" 2>/dev/null; then
    echo "install_deps: $venv already has tensorboard"
    return
  fi
  echo "install_deps: creating $venv with tensorboard"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q tensorboard
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages already installed"
  install_tools_venv
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
install_tools_venv
