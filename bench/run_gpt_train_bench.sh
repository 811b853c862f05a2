#!/usr/bin/env bash
# GPT training throughput: bridge's pretrain() in C++ (gpt_train_bench) against the same model and step in Python
# PyTorch (gpt_train_bench.py) on the same LibTorch, for a small GPT and for GPT-2 124M. Builds nothing: build the
# gpt_train_bench target first. Runs alternate C++, Python, C++, Python so that drift in the machine's load hits both.
# Prints a table with the ratio C++/Python (above 1: C++ is faster).
# Usage: bench/run_gpt_train_bench.sh [build-dir] [threads]
set -euo pipefail
build=${1:-build}
threads=${2:-2}
cd "$(dirname "$0")/.."
cpp="$build/bench/gpt_train_bench"
[[ -x "$cpp" ]] || { echo "no $cpp: cmake --build $build --target gpt_train_bench" >&2; exit 1; }
# --threads alone decides the intra-op threads; an inherited OMP_NUM_THREADS would override one side's default.
unset OMP_NUM_THREADS

# name|flags: the small GPT steps in well under a second; GPT-2 124M (50257 -> 50304 vocab) takes seconds a step.
configs=(
  "small-4L-d256|--layers 4 --hidden 256 --heads 4 --seq 128 --vocab 8192 --micro-batch 8 --steps 20 --warmup-steps 3"
  "gpt2-124M|--layers 12 --hidden 768 --heads 12 --seq 64 --vocab 50257 --micro-batch 4 --steps 4 --warmup-steps 1"
)
repeats=2
results=$(mktemp)
trap 'rm -f "$results"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for config in "${configs[@]}"; do
  name=${config%%|*}
  flags=${config#*|}
  for ((r = 0; r < repeats; ++r)); do
    # shellcheck disable=SC2086
    for program in "$cpp" "/usr/bin/python3 bench/gpt_train_bench.py"; do
      $program $flags --threads "$threads" 2>/dev/null | grep -E '^(cpp|python) ' | sed "s/^/$name /" | tee -a "$results"
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$results" <<'PY'
import statistics
import sys

runs = {}  # (config, who) -> list of dicts of one run's fields
for line in open(sys.argv[1]):
    config, who, *fields = line.split()
    values = dict(field.split("=", 1) for field in fields if "=" in field)
    if "tokens_per_s" in values:
        runs.setdefault((config, who), []).append(values)
print(f"{'config':<14} {'C++ tok/s':>10} {'Py tok/s':>10} {'C++/Py':>7} {'C++ ms':>9} {'Py ms':>9} {'threads':>7} params")
for config in dict.fromkeys(c for c, _ in runs):
    cpp, py = runs[(config, "cpp")], runs[(config, "python")]
    # The median of the repeats' per-run medians; each run already took the median over its timed steps.
    cpp_tps = statistics.median(float(r["tokens_per_s"]) for r in cpp)
    py_tps = statistics.median(float(r["tokens_per_s"]) for r in py)
    cpp_ms = statistics.median(float(r["step_ms"]) for r in cpp)
    py_ms = statistics.median(float(r["step_ms"]) for r in py)
    params = {r["params"] for r in cpp + py}
    same = params.pop() if len(params) == 1 else "MISMATCH " + "/".join(sorted(params))
    print(f"{config:<14} {cpp_tps:>10.1f} {py_tps:>10.1f} {cpp_tps / py_tps:>7.3f} {cpp_ms:>9.1f} {py_ms:>9.1f} "
          f"{cpp[0]['threads']:>7} {same}")
PY
