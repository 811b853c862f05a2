#!/usr/bin/env bash
# Context parallelism at a long sequence (context_parallel_bench): each rank's activation peak against the
# preflight's predicted activations (training/utils/theoretical_memory) at cp 1, 2 and 4 (world = cp, one intra-op
# thread a rank), and the step time of each cp_comm_type at cp 2 (2 ranks x 1 thread) against cp 1 on the same
# sequence (1 rank x 1 thread, and 1 rank x 2 threads: the same cores), in one run so that the machine's drift hits
# all alike. The model: the Llama block (RMSNorm, RoPE, SwiGLU, untied), 4 layers, hidden 256, 4 heads, one
# micro-batch of 8192 tokens, vocabulary 8192, fp32. Builds nothing: build the context_parallel_bench target first. Prints two Markdown tables, then the load
# average and the raw lines:
#
# | cp | cp_comm_type | predicted activations (MiB) | measured (MiB, max over ranks) | measured / predicted | ranks' spread |
# | run | best ms/step | / cp 1, 1 thread | / cp 1, 2 threads | median ms/step | load at its end |
#
# "measured" is the most bytes of live CPU tensors between a micro-batch's forward start and its backward end, less
# those alive at its start (context_parallel_bench). The ratios are of the fastest timed steps over all rounds, the
# least disturbed by other work on a shared machine; the median is over the rounds of each run's median step.
#
# Usage: bench/run_context_parallel_bench.sh [--build DIR] [--rounds N] [--seq N] [--cps "1 2 4"]
#            [--comm-types "p2p all_gather a2a"] [--steps N] [-- model flags and overrides for every run]
#   --cps: the memory rows, each cp with every comm type; the timing rows are always cp 2 against cp 1 (cp 4's four
#   ranks on a 2-core machine time nothing useful). Every run's --threads is the script's. Defaults: 1 round, seq 8192, 3 timed steps after 1 warm-up step.
set -euo pipefail
build=build
rounds=1
seq=8192
cps="1 2 4"
comm_types="p2p all_gather a2a"
steps=3
while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --cps) cps="$2"; shift 2 ;;
    --comm-types) comm_types="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "run_context_parallel_bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
program="$build/bench/context_parallel_bench"
[[ -x "$program" ]] || { echo "no $program: cmake --build $build --target context_parallel_bench" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "run_context_parallel_bench.sh: needs mpirun (openmpi-bin)" >&2; exit 2; }
# --threads alone decides the intra-op threads.
unset OMP_NUM_THREADS
flags=(--block llama --layers 4 --hidden 256 --heads 4 --seq "$seq" --vocab 8192 --micro-batch 1 --threads 1 "$@")
as_root=()
[[ "$(id -u)" != 0 ]] || as_root=(--allow-run-as-root)
work="$(mktemp -d "${TMPDIR:-/tmp}/cp_bench.XXXXXX")"
trap 'rm -rf "$work"' EXIT
results="$work/results"
: >"$results"

# run CP COMM THREADS [STEPS WARMUP]: one job of CP ranks of THREADS intra-op threads each (one process, no launcher,
# at cp 1); its ranks' lines go to $results tagged with the round, cp, comm type and the 1-minute load average at its
# end. The training log goes to a file; its end is shown if the job fails.
run() {
  local cp="$1" comm="$2" threads="$3" timed="${4:-$steps}" warmup="${5:-1}" log="$work/log" launcher=()
  if ((cp > 1)); then
    local port
    port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    launcher=(mpirun "${as_root[@]}" --oversubscribe --bind-to none -np "$cp" -x MASTER_ADDR=127.0.0.1
      -x MASTER_PORT="$port")
  fi
  if ! "${launcher[@]}" "$program" --steps "$timed" --warmup-steps "$warmup" "${flags[@]}" --threads "$threads" \
    parallelism.context_parallel_size="$cp" model.cp_comm_type="$comm" >"$log.out" 2>"$log"; then
    echo "run_context_parallel_bench.sh: cp $cp $comm failed:" >&2
    tail -20 "$log" "$log.out" >&2
    exit 1
  fi
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  grep -o 'cpbench .*' "$log.out" | sed "s/^/round=$round cp=$cp comm=$comm load=$load /" >>"$results"
}

echo "CPU: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((round = 1; round <= rounds; ++round)); do
  run 1 p2p 1
  for comm in $comm_types; do run 2 "$comm" 1; done
  run 1 p2p 2  # the same two threads as cp 2's ranks, in one process
  for cp in $cps; do
    if ((cp > 2)); then  # memory only: one step is enough
      for comm in $comm_types; do run "$cp" "$comm" 1 1 0; done
    fi
  done
  echo "load average after round $round: $(cut -d' ' -f1-3 /proc/loadavg)"
done

/usr/bin/python3 - "$results" <<'PY'
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)  # (cp, comm, threads) -> one dict per rank line, every round
for line in open(sys.argv[1]):
    fields = dict(field.split("=", 1) for field in line.split() if "=" in field)
    runs[(int(fields["cp"]), fields["comm"], int(fields["threads"]))].append(fields)

print()
print("| cp | cp_comm_type | predicted activations (MiB) | measured (MiB, max over ranks) | measured / predicted "
      "| ranks' spread (MiB) |")
print("|---|---|---|---|---|---|")
ORDER = ["p2p", "all_gather", "a2a"]
for (cp, comm, threads), lines in sorted(runs.items(), key=lambda item: (item[0][0], ORDER.index(item[0][1]))):
    if threads != 1:
        continue
    measured = [float(f["activation_peak_mib"]) for f in lines]
    predicted = float(lines[0]["predicted_activations_mib"])
    name = comm if cp > 1 else "-"
    print(f"| {cp} | {name} | {predicted:.0f} | {max(measured):.0f} | {100 * max(measured) / predicted:.0f} % "
          f"| {min(measured):.0f}-{max(measured):.0f} |")

def step_ms(cp, comm, threads):
    """The fastest timed step over every round (the least disturbed by other work on a shared machine), the median
    over rounds of each run's median step (for both, the slowest rank's: the ranks wait for one another), and the
    median load average at the runs' ends."""
    best, median, loads = defaultdict(list), defaultdict(list), []
    for f in runs.get((cp, comm, threads), []):
        best[f["round"]].append(float(f["best_ms"]))
        median[f["round"]].append(float(f["step_ms"]))
        loads.append(float(f["load"]))
    if not best:
        return float("nan"), float("nan"), float("nan")
    return (min(max(v) for v in best.values()), statistics.median(max(v) for v in median.values()),
            statistics.median(loads))

one, one_median, one_load = step_ms(1, "p2p", 1)
two, two_median, two_load = step_ms(1, "p2p", 2)
print()
print("| run | best ms/step | / cp 1, 1 thread | / cp 1, 2 threads | median ms/step | load at its end |")
print("|---|---|---|---|---|---|")
print(f"| cp 1, 1 rank x 1 thread | {one:.0f} | 1.00 | {one / two:.2f} | {one_median:.0f} | {one_load:.1f} |")
print(f"| cp 1, 1 rank x 2 threads | {two:.0f} | {two / one:.2f} | 1.00 | {two_median:.0f} | {two_load:.1f} |")
for comm in sorted({comm for cp, comm, threads in runs if cp == 2}, key=ORDER.index):
    ms, median, load = step_ms(2, comm, 1)
    print(f"| cp 2 {comm}, 2 ranks x 1 thread | {ms:.0f} | {ms / one:.2f} | {ms / two:.2f} | {median:.0f} "
          f"| {load:.1f} |")
print()
PY
cat "$results"
