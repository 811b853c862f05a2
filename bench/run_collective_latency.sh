#!/usr/bin/env bash
# all_reduce latency per group size: bridge's C++ process groups against Python torch.distributed (Gloo) on the same
# LibTorch, both launched by mpirun with 2, 4 and 8 ranks on this machine. Prints a table with the ratio C++/Python.
# Usage: bench/run_collective_latency.sh [build-dir]
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
results=$(mktemp)
for ranks in 2 4 8; do
  for program in "$build/bench/collective_latency" "/usr/bin/python3 bench/collective_latency.py"; do
    port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # shellcheck disable=SC2086
    mpirun --allow-run-as-root --oversubscribe -np "$ranks" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
      -x OMP_NUM_THREADS=1 $program | grep -E '^(cpp|python) ' >> "$results"
  done
done
/usr/bin/python3 - "$results" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    who, ranks, size, ms = line.split()
    rows.setdefault((int(ranks), int(size)), {})[who] = float(ms)
print(f"{'ranks':>5} {'bytes':>9} {'C++ ms':>9} {'Python ms':>10} {'C++/Python':>10}")
for (ranks, size), r in sorted(rows.items()):
    print(f"{ranks:>5} {size:>9} {r['cpp']:>9.3f} {r['python']:>10.3f} {r['cpp'] / r['python']:>10.2f}")
PY
rm -f "$results"
