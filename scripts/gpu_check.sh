#!/usr/bin/env bash
# The one-command GPU check: builds bridge against the PyTorch of this machine's Python, runs the tests labelled
# `cuda`, then trains GPT-2 124M and the tiny Llama in bf16 on the GPU with SpeedMonitor and MemoryMonitor and prints
# their figures (tokens/s, TFLOP/s, MFU, peak memory). Made for a machine with a GPU, a PyTorch 2.x wheel with CUDA,
# cmake, ninja and a C++ compiler but not bridge's Debian packages (such as the lent device): --debs unpacks the
# packages' .deb files into a prefix that the build and the programs search, so nothing is installed system-wide.
#
#   scripts/gpu_check.sh [--cpu] [--debs DIR] [--build DIR] [--python PYTHON] [--steps N]
#   scripts/gpu_check.sh --collect-debs DIR    # on a machine with the packages: copies their .deb files into DIR
#
# --cpu is the dry run: the same steps on the CPU (the cuda tests skip, the runs are tiny), to prove the script before
# device time is spent on it. Exit status: 0 when every step passed; the failing step's otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Debian packages the build needs (headers, CMake/pkg-config files, libraries) and the libraries those load.
DEBS=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libcxxopts-dev
  libcpp-httplib-dev libcpp-httplib0.11 prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0
  libprometheus-cpp-push1.0 libcivetweb-dev libcivetweb1 civetweb libcurl4-openssl-dev libcurl4 libboost1.74-dev
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
  libpmix2 libfabric1 libucx0 libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200
  libpcre2-dev libpcre2-8-0 libicu-dev libicu72 libsentencepiece-dev libsentencepiece0 libgtest-dev libgmock-dev
  googletest zlib1g-dev libssl-dev libbrotli-dev libbrotli1)

cpu=0 debs="" build="" python="" steps=30
pkg_config_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu) cpu=1 ;;
    --debs) debs="$2"; shift ;;
    --build) build="$2"; shift ;;
    --python) python="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --collect-debs)
      # From apt's cache where the install left them, else downloaded (apt-get download: no root, no install).
      mkdir -p "$2"
      missing=()
      for name in "${DEBS[@]}"; do
        found=$(ls /var/cache/apt/archives/"${name}"_*.deb 2>/dev/null | head -1 || true)
        if [[ -n "$found" ]]; then cp "$found" "$2/"; else missing+=("$name"); fi
      done
      if [[ ${#missing[@]} -gt 0 ]]; then (cd "$2" && apt-get download "${missing[@]}"); fi
      echo "gpu_check: $(ls "$2"/*.deb | wc -l) packages in $2 ($(du -sh "$2" | cut -f1))"
      exit 0 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if ! [[ "$steps" =~ ^[0-9]+$ ]] || [[ "$steps" -lt 2 ]]; then
  echo "gpu_check: --steps must be an integer >= 2, got '$steps'" >&2
  exit 2
fi
build=${build:-build-gpu-check}
if [[ -z "$python" ]]; then python=$([[ -x .venv/bin/python3 ]] && echo .venv/bin/python3 || echo python3); fi
step() { echo; echo "== gpu_check: $*"; }

step "PyTorch of $python"
torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")'
if [[ $cpu -eq 0 ]] && ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: $python's PyTorch sees no CUDA device; run with --cpu for the dry run" >&2
  exit 2
fi

prefixes="$torch_prefix"
if [[ -n "$debs" ]]; then
  step "unpacking $(ls "$debs"/*.deb | wc -l) packages from $debs"
  deps=$(realpath -m "$build/deps")
  mkdir -p "$deps"
  for f in "$debs"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$deps"
    else  # a .deb is an ar archive whose data.tar.* holds the files
      scratch=$(mktemp -d)
      member=$(ar t "$f" | grep '^data\.tar')
      (cd "$scratch" && ar x "$(realpath "$f")" "$member" && tar -xf "$member" -C "$deps")
      rm -rf "$scratch"
    fi
  done
  multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  prefixes="$prefixes;$deps/usr"
  # pkg-config reads only the prefix's files and prefixes their /usr paths with it.
  export PKG_CONFIG_LIBDIR="$deps/usr/lib/$multiarch/pkgconfig:$deps/usr/share/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$deps"
  export LD_LIBRARY_PATH="$deps/usr/lib/$multiarch:$deps/usr/lib/$multiarch/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX="$deps/usr" PATH="$deps/usr/bin:$PATH"  # Open MPI relocated to the prefix
  # Open MPI's mpicxx is an alternatives link that dpkg-deb -x does not make: name the wrapper itself.
  pkg_config_args=("-DMPI_CXX_COMPILER=$deps/usr/bin/mpicxx.openmpi")
fi

step "configure and build ($build)"
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBRIDGE_LIBTORCH=system "-DCMAKE_PREFIX_PATH=$prefixes" \
  -DBRIDGE_BUILD_BENCHMARKS=OFF -DBRIDGE_BUILD_EXAMPLES=OFF "${pkg_config_args[@]}" >"$build/configure.log" 2>&1 ||
  { tail -30 "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target cuda_test bridge-pretrain

step "tests labelled cuda"
ctest --test-dir "$build" -L cuda --output-on-failure

# One run: bridge-pretrain on random tokens (no data to carry) with the monitors; prints its last record's figures.
train() {
  local name=$1
  shift
  local out="$build/gpu_check_$name"
  rm -rf "$out" && mkdir -p "$out"
  step "$name"
  "$build/tools/bridge-pretrain" "$@" train.train_iters="$steps" logging.log_interval="$((steps / 2))" \
    logging.jsonl_path="$out/metrics.jsonl" checkpoint.save=null checkpoint.save_interval=null train.eval_iters=1 \
    "callbacks=[{type: SpeedMonitor, window_size: $((steps / 2))}, {type: MemoryMonitor}]" 2>&1 | tail -5
  "$python" - "$out/metrics.jsonl" "$name" <<'EOF'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
last = [r for r in records if "throughput/tokens_per_sec" in r][-1]
mfu = last.get("throughput/device/mfu")
figures = [f"step {last['step']}", f"tokens/s {last['throughput/tokens_per_sec']:.0f}",
           f"TFLOP/s {last.get('throughput/device/tflops_per_sec', 0):.2f}",
           f"MFU {100 * mfu:.1f}%" if mfu is not None else "MFU n/a"]
figures += [f"{key} {value:.3f}" for key, value in sorted(last.items())
            if key.startswith("memory/") and not key.endswith("/min")]
print(f"gpu_check {sys.argv[2]}: " + ", ".join(figures))
EOF
}

if [[ $cpu -eq 1 ]]; then
  train gpt2_tiny_cpu --config examples/recipes/gpt2_124m.yaml dataset.data_path=[] parallelism.device=cpu \
    model.num_layers=2 model.hidden_size=64 model.num_attention_heads=2 model.seq_length=64 model.vocab_size=1024 \
    train.micro_batch_size=2 train.global_batch_size=2 train.eval_interval=1000000 mixed_precision=bf16_mixed
  train tiny_llama_cpu --config examples/recipes/tiny_llama.yaml dataset.data_path=[] parallelism.device=cpu \
    train.eval_interval=1000000 mixed_precision=bf16_mixed
else
  train gpt2_124m_bf16 --config examples/recipes/gpt2_124m.yaml dataset.data_path=[] parallelism.device=cuda \
    train.micro_batch_size=16 train.global_batch_size=16 train.eval_interval=1000000 mixed_precision=bf16_mixed
  train tiny_llama_bf16 --config examples/recipes/tiny_llama.yaml dataset.data_path=[] parallelism.device=cuda \
    train.micro_batch_size=64 train.global_batch_size=64 model.seq_length=1024 train.eval_interval=1000000 \
    mixed_precision=bf16_mixed
fi
step "done"
