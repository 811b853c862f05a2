#!/usr/bin/env bash
# Every test on a fresh machine, in one command: installs the dependencies, builds against the default LibTorch (2.x
# from the torch wheel) and runs the whole suite, then builds the core tests and the libFuzzer targets against
# Debian's LibTorch 1.13 with clang, AddressSanitizer and UndefinedBehaviorSanitizer, runs the core tests again (which
# keeps the light 1.13 install building and working) and each fuzzer 20 s from its seeds on a fixed seed.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/install_deps.sh

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
ctest --test-dir build -j "$jobs" --output-on-failure

# One sanitizer build serves the core tests and the fuzzers: clang (GCC has no libFuzzer), ASan + UBSan, coverage
# for the fuzzers, against Debian's LibTorch 1.13. -O1 -g1 keeps the fuzzers' executions per second useful and
# file:line in the reports; the tests' time is mostly inside LibTorch, which is not rebuilt.
cmake -S . -B build-asan -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g1" \
  -DBRIDGE_SANITIZE=ON -DBRIDGE_BUILD_FUZZERS=ON -DBRIDGE_LIBTORCH=system -DBRIDGE_BUILD_EXAMPLES=OFF \
  -DBRIDGE_BUILD_BENCHMARKS=OFF -DBRIDGE_TEST_WHOLE_BINARIES=ON
cmake --build build-asan -j "$jobs" --target core_tests fuzzers  # only what `ctest -L core` and the fuzzing run
# Each test binary runs as one process (BRIDGE_TEST_WHOLE_BINARIES): a sanitized start-up of LibTorch costs ~1.6 s,
# which one process per test case paid 468 times.
ctest --test-dir build-asan -L core -j "$jobs" --output-on-failure

# A fixed seed: the suite's 20 s replay the same inputs every run, so a failure here is a change's, not chance's
# (new ground is the long run's job: scripts/fuzz.sh 3600).
BRIDGE_FUZZ_SEED=1 BRIDGE_FUZZ_BUILD=build-asan scripts/fuzz.sh 20
