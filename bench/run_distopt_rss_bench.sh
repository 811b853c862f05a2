#!/usr/bin/env bash
# The distributed optimizer's saving in resident memory, as a user sees it: peak RSS of each rank (`/usr/bin/time`'s
# maximum resident set) of `mpirun -np 2 bridge-pretrain` without and with the distributed optimizer
# (optimizer.use_distributed_optimizer=true ddp.use_distributed_optimizer=true), with bridge's defaults and nothing in
# the environment. The predicted saving is what the preflight's "theoretical memory per rank" line gives the optimizer
# state in the one run less the other (Adam's fp32 moments: 8 bytes a parameter, kept for 1/dp of them). Prints the
# Markdown table, one row per round (the two runs of a round back to back), then the raw numbers:
#
# | round | dp 2 peak RSS (MiB, rank 0 / 1) | distributed optimizer | saving (MiB, the smaller rank's) | predicted | saving / predicted | training s (dp 2 / dist. opt.) |
#
# Usage: bench/run_distopt_rss_bench.sh [--build DIR] [--rounds N] [--np N] [-- bridge-pretrain overrides]
#   defaults: build, 2 rounds, 2 ranks, model.num_layers=8 model.hidden_size=768 train.micro_batch_size=2
#   train.train_iters=10 (the issue's run; fp32), overrides after -- are added to both runs. Builds nothing: build
#   bridge-pretrain first. MiB are 2^20 bytes (`/usr/bin/time -f %M` is KiB).
set -euo pipefail
build=build
rounds=2
np=2
while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --np) np="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "run_distopt_rss_bench.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
pretrain="$build/tools/bridge-pretrain"
[[ -x "$pretrain" ]] || { echo "run_distopt_rss_bench.sh: no $pretrain (build bridge-pretrain first)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "run_distopt_rss_bench.sh: needs mpirun (openmpi-bin)" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "run_distopt_rss_bench.sh: needs /usr/bin/time (the time package)" >&2; exit 2; }
model=(model.num_layers=8 model.hidden_size=768 train.micro_batch_size=2 train.train_iters=10 "$@")
distopt=(optimizer.use_distributed_optimizer=true ddp.use_distributed_optimizer=true)
# bridge's own malloc settings apply only where the environment sets none: say so rather than measure something else.
for name in MALLOC_MMAP_MAX_ MALLOC_TRIM_THRESHOLD_ MALLOC_MMAP_THRESHOLD_ MALLOC_TOP_PAD_ MALLOC_ARENA_MAX; do
  [[ -z "${!name:-}" ]] || echo "run_distopt_rss_bench.sh: note: $name is set, bridge's allocator settings are off" >&2
done
[[ "${GLIBC_TUNABLES:-}" != *glibc.malloc.* ]] || echo "run_distopt_rss_bench.sh: note: GLIBC_TUNABLES sets malloc" >&2
as_root=()
[[ "$(id -u)" != 0 ]] || as_root=(--allow-run-as-root)
work="$(mktemp -d "${TMPDIR:-/tmp}/distopt_rss.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# run NAME OVERRIDES...: each rank under /usr/bin/time, its peak RSS (KiB) and minor faults in NAME.rss.<rank>.
run() {
  local name="$1"; shift
  # shellcheck disable=SC2016  # $0, $OMPI_COMM_WORLD_RANK and $@ are the rank's shell's
  mpirun "${as_root[@]}" --oversubscribe -np "$np" sh -c \
    'exec /usr/bin/time -f "%M %R" -o "$0.rss.$OMPI_COMM_WORLD_RANK" "$@"' "$work/$name" "$pretrain" "$@" \
    >"$work/$name.log" 2>&1 || { echo "run_distopt_rss_bench.sh: $name failed:" >&2; tail -20 "$work/$name.log" >&2; exit 1; }
}
rss_mib() { for ((r = 0; r < np; ++r)); do awk '{printf "%.0f ", $1 / 1024}' "$work/$1.rss.$r"; done; }
# The preflight's optimizer state, in MiB whichever unit it printed.
optimizer_mib() {
  grep -m1 -oE 'optimizer [0-9.]+ [KMG]iB' "$work/$1.log" |
    awk '{f = $3 == "GiB" ? 1024 : ($3 == "KiB" ? 1 / 1024 : 1); printf "%.1f", $2 * f}'
}
training_s() { grep -m1 -oE 'training [0-9.]+ s' "$work/$1.log" | grep -oE '[0-9.]+'; }

echo "| round | dp $np peak RSS (MiB, rank 0 / 1 ...) | distributed optimizer | saving (MiB, the smaller rank's) | predicted | saving / predicted | training s (dp $np / dist. opt.) |"
echo "|---|---|---|---|---|---|---|"
raw=()
for ((round = 1; round <= rounds; ++round)); do
  run plain "${model[@]}"
  run distopt "${model[@]}" "${distopt[@]}"
  read -r -a plain <<<"$(rss_mib plain)"
  read -r -a dist <<<"$(rss_mib distopt)"
  predicted="$(awk -v a="$(optimizer_mib plain)" -v b="$(optimizer_mib distopt)" 'BEGIN { printf "%.1f", a - b }')"
  saving=""
  for ((r = 0; r < np; ++r)); do
    s=$((plain[r] - dist[r]))
    [[ -n "$saving" && "$saving" -le "$s" ]] || saving="$s"
  done
  ratio="$(awk -v s="$saving" -v p="$predicted" 'BEGIN { printf "%.0f %%", (p > 0 ? 100 * s / p : 0) }')"
  echo "| $round | ${plain[*]} | ${dist[*]} | $saving | $predicted | $ratio | $(training_s plain) / $(training_s distopt) |"
  raw+=("round $round: plain rss_kib+faults $(cat "$work"/plain.rss.* | tr '\n' ' ')| distopt $(cat "$work"/distopt.rss.* | tr '\n' ' ')")
done
echo
printf '%s\n' "${raw[@]}"
