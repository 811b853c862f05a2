#!/usr/bin/env bash
# Every test on a fresh machine, in one command: installs the dependencies, builds against the default LibTorch (2.x
# from the torch wheel) and runs the whole suite, then builds the core tests against Debian's LibTorch 1.13 with
# AddressSanitizer and UndefinedBehaviorSanitizer and runs them again, which keeps the light 1.13 install building and
# working. Last, the libFuzzer targets (clang) run 20 s each from their seeds, on a fixed seed (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/install_deps.sh

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
ctest --test-dir build -j "$jobs" --output-on-failure

# -O0 -g1: half the compile time of -O2 -g (no inlining of LibTorch's header code), with file:line in the reports;
# the tests' time is mostly inside LibTorch, which is not rebuilt.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O0 -g1 -DNDEBUG" -DBRIDGE_SANITIZE=ON \
  -DBRIDGE_LIBTORCH=system -DBRIDGE_BUILD_EXAMPLES=OFF -DBRIDGE_BUILD_BENCHMARKS=OFF
cmake --build build-asan -j "$jobs" --target core_tests  # only what `ctest -L core` runs
ctest --test-dir build-asan -L core -j "$jobs" --output-on-failure

# A fixed seed: the suite's 20 s replay the same inputs every run, so a failure here is a change's, not chance's
# (new ground is the long run's job: scripts/fuzz.sh 3600).
BRIDGE_FUZZ_SEED=1 scripts/fuzz.sh 20
