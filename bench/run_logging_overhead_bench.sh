#!/usr/bin/env bash
# The training log's per-step overhead (logging_overhead_bench): a small GPT through pretrain() with logging all off
# (A) and all on at every step (B), alternated inside each run, once alone and once as 2 ranks under mpirun with
# pipeline_model_parallel_size 2, 1 intra-op thread per rank. Builds nothing: build the logging_overhead_bench target
# first (cmake -DBRIDGE_BUILD_BENCHMARKS=ON). Prints the load average around the runs and a table per rank: median step
# (one loop iteration) of A and B, B/A, B - A (pooled and paired per repeat), the median time after
# on_train_step_end (where the log step runs) and the world and model-parallel collectives per step. Groups of one
# communicate nothing and count no collectives.
# Usage: bench/run_logging_overhead_bench.sh [build-dir] [timed-steps] [repeats]
set -euo pipefail
build=${1:-build}
steps=${2:-30}
repeats=${3:-3}
cd "$(dirname "$0")/.."
program="$build/bench/logging_overhead_bench"
[[ -x "$program" ]] || { echo "no $program: cmake --build $build --target logging_overhead_bench" >&2; exit 1; }
# --threads alone decides the intra-op threads.
unset OMP_NUM_THREADS
flags=(--layers 4 --hidden 256 --heads 4 --seq 128 --vocab 8192 --micro-batch 8 --steps "$steps" --warmup-steps 5
  --repeats "$repeats" --threads 1)
results=$(mktemp)
log=$(mktemp)
trap 'rm -f "$results" "$log"' EXIT
# The training log goes to stderr (a file here, as a job's would); show its end if a run fails.
run() {
  if ! "$@" 2>"$log" | grep '^logbench ' >>"$results"; then
    echo "failed: $*" >&2
    tail -20 "$log" >&2
    exit 1
  fi
}
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
run "$program" "${flags[@]}"
echo "load average after 1 rank: $(cut -d' ' -f1-3 /proc/loadavg)"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
run mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
  "$program" "${flags[@]}" --pp 2
echo "load average after 2 ranks: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$results" <<'PY'
import sys

print(f"{'world':>5} {'tp':>2} {'pp':>2} {'rank':>4} {'A ms':>8} {'B ms':>8} {'B/A':>6} {'B-A':>7} {'paired':>7} "
      f"{'A tail':>7} {'B tail':>7} {'tail B-A':>8} {'A world/mp':>10} {'B world/mp':>10} {'steps':>5}")
for line in open(sys.argv[1]):
    v = dict(field.split("=", 1) for field in line.split()[1:])
    ms = {key: float(v[key]) for key in v if key.endswith("_ms") or key == "ratio"}
    print(f"{v['world']:>5} {v['tp']:>2} {v['pp']:>2} {v['rank']:>4} {ms['a_ms']:>8.1f} {ms['b_ms']:>8.1f} "
          f"{ms['ratio']:>6.3f} {ms['overhead_ms']:>7.1f} {ms['paired_overhead_ms']:>7.1f} {ms['a_tail_ms']:>7.2f} "
          f"{ms['b_tail_ms']:>7.2f} {ms['tail_overhead_ms']:>8.2f} {v['a_world_ops'] + '/' + v['a_mp_ops']:>10} "
          f"{v['b_world_ops'] + '/' + v['b_mp_ops']:>10} {v['steps']:>5}")
print("ms per step (one loop iteration, medians); paired: median over repeats of B - A of neighbouring runs; tail:")
print("after on_train_step_end, where the log step runs; world/mp: collectives per step (groups of one count none)")
PY
