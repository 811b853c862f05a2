#!/usr/bin/env bash
# ThreadSanitizer over bridge's threaded code: the async observers, the ControlEndpoint's HTTP server and its control
# agreement, async checkpoint saves, the SIGTERM handler and the logger. Builds the test binaries that drive them with
# -fsanitize=thread (gcc, Debian's LibTorch 1.13, in build-tsan) and runs each whole; any race report fails the run.
# Not part of CI (a second instrumented build does not fit its time); run it after changing anything threaded.
#
#   scripts/tsan.sh                 # build (about 15 minutes cold on 2 cores) and run (about 2 minutes)
#   scripts/tsan.sh --gtest_filter='Endpoint*'   # arguments go to every test binary
#
# LibTorch itself is not instrumented, so its intra-op threads would be invisible to TSan and report as races on the
# tensors they touch: the binaries run with one OpenMP thread, which leaves bridge's own threads as the only ones.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BRIDGE_TSAN_BUILD:-build-tsan}
binaries=(callbacks_test builtin_callbacks_test control_endpoint_test utils_test checkpoint_test)

if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g1" -DBRIDGE_TSAN=ON \
    -DBRIDGE_LIBTORCH=system -DBRIDGE_BUILD_EXAMPLES=OFF -DBRIDGE_BUILD_BENCHMARKS=OFF
fi
cmake --build "$build" -j "$(nproc)" --target "${binaries[@]}"

export OMP_NUM_THREADS=1
# halt_on_error: the first race fails the binary (exit 66) with its report; second_deadlock_stack: both stacks of a
# lock-order inversion.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
failed=()
for binary in "${binaries[@]}"; do
  echo "tsan: $binary"
  if ! (cd "$build/tests" && "./$binary" "$@"); then failed+=("$binary"); fi
done
if ((${#failed[@]})); then
  echo "tsan: FAILED: ${failed[*]} (reports above: 'WARNING: ThreadSanitizer: ...')" >&2
  exit 1
fi
echo "tsan: ${#binaries[@]} binaries passed with no race reported"
