#!/usr/bin/env bash
# Builds bridge's libFuzzer targets (clang, AddressSanitizer + UndefinedBehaviorSanitizer, coverage over every bridge
# source) and runs each for SECONDS from its seeds in fuzz/corpus/<target>. Fails on the first crash, sanitizer
# report, leak, timeout or broken round trip, leaving the input that did it as <build>/fuzz-artifacts/<target>-*.
#
#   scripts/fuzz.sh                  # 60 s per target, one target per core (a few minutes with the build)
#   scripts/fuzz.sh 3600             # the long run: an hour per target
#   BRIDGE_FUZZ_BUILD=build-asan scripts/fuzz.sh 20   # reuse a build configured with -DBRIDGE_BUILD_FUZZERS=ON
#   BRIDGE_FUZZ_SEED=1 scripts/fuzz.sh 20              # the same inputs in the same order every run (what CI does)
#
# Without BRIDGE_FUZZ_SEED each run draws a new seed (libFuzzer prints it: "INFO: Seed: N"), so repeated runs explore
# further; with one, a run is the same sequence of inputs, cut off by the time, and a failure it finds comes back
# with the same seed on any machine at least as fast.
#
# New inputs that reach new code collect in <build>/fuzz-corpus/<target> (the seeds in the repository are not
# touched); `<target> -merge=1 fuzz/corpus/<target> <build>/fuzz-corpus/<target>` adds the useful ones to the seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
seed=${BRIDGE_FUZZ_SEED:-0}  # 0: libFuzzer draws one
build=${BRIDGE_FUZZ_BUILD:-build-fuzz}
targets=(fuzz_indexed_dataset fuzz_npy fuzz_config_yaml fuzz_config_override fuzz_tokenizer fuzz_checkpoint)

if [[ ! -f $build/CMakeCache.txt ]]; then
  # Debian's LibTorch 1.13, as the sanitizer build of scripts/test.sh; -O1 keeps the executions per second useful.
  cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g1" \
    -DBRIDGE_SANITIZE=ON -DBRIDGE_BUILD_FUZZERS=ON -DBRIDGE_LIBTORCH=system -DBRIDGE_BUILD_TESTS=OFF \
    -DBRIDGE_BUILD_EXAMPLES=OFF -DBRIDGE_BUILD_BENCHMARKS=OFF
fi
cmake --build "$build" -j "$(nproc)" --target fuzzers

mkdir -p "$build/fuzz-artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# libFuzzer runs on one thread: the targets run side by side, one per core, each for the same time as alone.
jobs=${BRIDGE_FUZZ_JOBS:-$(nproc)}
declare -A target_of=()
# Waits for any running target; on its failure prints its log's end and the input's place, stops the others, exits 1.
finish_one() {
  local pid="" status=0
  wait -n -p pid || status=$?
  local target=${target_of[$pid]}
  unset "target_of[$pid]"
  rm -rf "/dev/shm/bridge_fuzz_$pid" "${TMPDIR:-/tmp}/bridge_fuzz_$pid"  # the harness's scratch files (fuzz_support.h)
  if ((status != 0)); then
    kill "${!target_of[@]}" 2>/dev/null || true
    tail -n 60 "$build/fuzz-artifacts/$target.log"
    grep -m1 "^INFO: Seed:" "$build/fuzz-artifacts/$target.log" >&2 || true
    echo "fuzz: $target FAILED; the input is in $build/fuzz-artifacts/ (run it: $build/fuzz/$target <file>)" >&2
    exit 1
  fi
  echo "fuzz: $target done"
  grep -E "^stat::number_of_executed_units|^#[0-9]+ *DONE" "$build/fuzz-artifacts/$target.log" | tail -n 2 || true
}
for target in "${targets[@]}"; do
  corpus="$build/fuzz-corpus/$target"
  mkdir -p "$corpus"
  echo "fuzz: $target for ${seconds}s"
  "$build/fuzz/$target" "$corpus" "fuzz/corpus/$target" -max_total_time="$seconds" -seed="$seed" -timeout=20 \
    -rss_limit_mb=4096 -max_len=8192 -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$target-" \
    >"$build/fuzz-artifacts/$target.log" 2>&1 &
  target_of[$!]=$target
  while ((${#target_of[@]} >= jobs)); do finish_one; done
done
while ((${#target_of[@]} > 0)); do finish_one; done
echo "fuzz: every target ran ${seconds}s without a failure"
