#!/usr/bin/env bash
# Installs the Debian packages bridge needs to build, test and benchmark, then the project's venv (<repo>/.venv) with
# the pinned torch wheel, whose LibTorch 2.x (CUDA and NCCL inside) bridge builds against by default, and tensorboard,
# whose reader the tests check event files with. Idempotent: packages already present are left alone and apt is not
# even asked to refresh its lists, and a venv that already has its packages is not touched, so a second run takes
# about a second.
#
# Usage: scripts/install_deps.sh [--libtorch=wheel|debian]     (as root, or with sudo available)
#   --libtorch=wheel   (default) the pinned torch (torch_version below) from PyPI into .venv: ~3.5 GB with its CUDA
#                      libraries, about a minute to download here
#   --libtorch=debian  a light CPU-only install: Debian's LibTorch 1.13 only
# BRIDGE_LIBTORCH=debian in the environment does the same, and makes CMake pick the system's LibTorch too, so
# `BRIDGE_LIBTORCH=debian scripts/run.sh` is the light way through both README commands.
set -euo pipefail

torch_version=2.15.0  # the LibTorch bridge is tested against; bump together with the README
transformers_version=5.23.0  # the tests' Hugging Face reference
safetensors_version=0.8.0
tokenizers_version=0.23.3     # the tests' reference for tokenizer.json (transformers' own tokenizer library)
sentencepiece_version=0.2.3   # the tests' reference for SentencePiece models
tiktoken_version=0.14.0       # the tokenizer benchmark's other reference (bench/run_tokenizer_bench.sh)
libtorch=${BRIDGE_LIBTORCH:-wheel}
for arg in "$@"; do
  case "$arg" in
    --libtorch=*) libtorch=${arg#--libtorch=} ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "install_deps: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ $libtorch == system ]]; then libtorch=debian; fi
if [[ $libtorch != wheel && $libtorch != debian ]]; then
  echo "install_deps: --libtorch must be wheel or debian, got '$libtorch'" >&2
  exit 2
fi

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev          # LibTorch 1.13 (CPU): the light install, and CI keeps bridge building against it
  libgloo-dev           # Gloo headers that c10d's ProcessGroupGloo exposes
  libopenblas0-pthread  # replaces reference BLAS behind libblas.so.3: ~15x faster CPU matmuls
  libopenmpi-dev openmpi-bin  # mpirun launch and the MPI rank/address bootstrap
  libspdlog-dev         # rank-aware logging
  zlib1g-dev            # CRC32 (crc32): checkpoints are verified before they are loaded
  libcxxopts-dev        # command-line parsing
  libyaml-cpp-dev       # bridge-pretrain's YAML recipes and --print-config
  libgtest-dev libgmock-dev   # unit tests
  libbenchmark-dev      # micro-benchmarks
  clang libclang-rt-14-dev  # the libFuzzer targets (fuzz/, scripts/fuzz.sh): clang and its fuzzer runtime
  nlohmann-json3-dev    # JSON Lines metric writer, JSON input of bridge-preprocess-data (header-only)
  libboost-dev          # Boost.Beast (header-only): the ControlEndpoint's HTTP/1.1 server. Its parser caps the head
                        # (431) and chunked bodies (413) while reading; Debian's cpp-httplib 0.11 buffers both unbounded
  libcpp-httplib-dev    # the HTTP client of the ControlEndpoint tests
  curl                  # the ControlEndpoint test drives the endpoint with the real curl, as users do
  prometheus-cpp-dev    # ControlEndpoint's GET /metrics in Prometheus' text format
  libconcurrentqueue-dev  # the async observers' lock-free queue (header-only)
  libpcre2-dev          # tokenizer.json's split patterns (Unicode properties, look-ahead), JIT-compiled
  libicu-dev            # tokenizer.json's Unicode normalizers (NFC, NFKC, ...) and character properties
  libsentencepiece-dev  # SentencePiece tokenizer.model files, through Google's own library
  python3-torch         # Python reference for parity checks, and torchrun
  python3-venv          # the tools venv below
  iproute2              # ip netns and veth pairs: the two-host rendezvous test (tests/rendezvous_two_hosts_test.sh)
)

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The venv: the torch wheel (LibTorch for the build, and the Python PyTorch the benchmarks compare against) and the
# independent readers the tests compare against (tensorboard's EventAccumulator, transformers' models, the tokenizers
# and sentencepiece packages, tiktoken for the tokenizer benchmark). It sees the system site-packages so that Debian's
# numpy (and, in a debian install, Debian's torch) stay usable from it.
install_venv() {
  local venv="$repo_root/.venv"
  local wanted=(tensorboard "tokenizers==$tokenizers_version" "sentencepiece==$sentencepiece_version"
                "tiktoken==$tiktoken_version")
  local check="import tensorboard, tokenizers, sentencepiece, tiktoken"
  check+="; assert tokenizers.__version__ == '$tokenizers_version'"
  check+="; assert sentencepiece.__version__ == '$sentencepiece_version'"
  if [[ $libtorch == wheel ]]; then
    # transformers' own models are the reference of bridge's Hugging Face bridges (tests/tools/hf_models.py); it needs
    # torch 2.x, so only beside the wheel.
    wanted+=("torch==$torch_version" "transformers==$transformers_version" "safetensors==$safetensors_version")
    check+="; import torch; assert torch.__version__.split('+')[0] == '$torch_version'"
    check+="; import transformers, safetensors; assert transformers.__version__ == '$transformers_version'"
  fi
  if [[ -x "$venv/bin/python3" ]] && "$venv/bin/python3" -c "$check" 2>/dev/null; then
    echo "install_deps: $venv already has ${wanted[*]}"
    return
  fi
  echo "install_deps: installing ${wanted[*]} into $venv"
  [[ -x "$venv/bin/python3" ]] || /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "${wanted[@]}"
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages already installed"
  install_venv
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
install_venv
