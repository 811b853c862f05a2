#!/usr/bin/env bash
# A disk that fills up during training: a 16 MiB tmpfs holds one checkpoint of the tiny recipe (about 10 MiB) but not
# two, so the second save fails with ENOSPC. Both ranks (data parallel, each writing its own torch_dist file) must exit 1
# with the reason and at once (no SIGABRT, no wait for the timeout), the tracker must still name the first checkpoint,
# no temporary file may be left, and the first checkpoint must resume on a disk with room, whose next save removes the
# interrupted iteration. Runs in a private mount namespace (unshare -rm: no root needed where user namespaces are
# allowed); exits 77 (CTest's skip) where it cannot make one.
# Usage: tests/disk_full_test.sh <bridge-pretrain>
set -euo pipefail
program=${1:?usage: $0 <bridge-pretrain>}
if [[ -z "${BRIDGE_DISK_FULL_NAMESPACE:-}" ]]; then
  if ! unshare -rm true 2>/dev/null; then
    echo "skipped: cannot make a mount namespace here (unshare -rm)"
    exit 77
  fi
  exec env BRIDGE_DISK_FULL_NAMESPACE=1 unshare -rm bash "$0" "$@"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/bridge_disk_full.XXXXXX")
trap 'umount "$work/disk" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir "$work/disk"
if ! mount -t tmpfs -o size=16m tmpfs "$work/disk"; then
  echo "skipped: cannot mount a tmpfs in the namespace"
  exit 77
fi
failures=0
check() {  # check <description> <command...>
  if "${@:2}"; then echo "ok: $1"; else echo "FAILED: $1"; failures=$((failures + 1)); fi
}

common=(dataset.data_path=[] train.eval_iters=0 logging.log_interval=1 checkpoint.save_interval=2)
port=$((20000 + RANDOM % 20000))
start=$(date +%s)
for rank in 0 1; do
  RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 120 "$program" "${common[@]}" train.train_iters=4 checkpoint.save="$work/disk/ckpt" \
    >"$work/rank$rank.log" 2>&1 &
  pids[rank]=$!
done
for rank in 0 1; do
  status=0
  wait "${pids[rank]}" || status=$?
  check "rank $rank exits 1 (got $status)" test "$status" -eq 1
done
elapsed=$(($(date +%s) - start))
check "both ranks ended within 60 s (took $elapsed s)" test "$elapsed" -lt 60
# torch_dist (the default): both ranks write their own file, so either may meet the full disk first.
check "a rank names the full disk" grep -q "No space left on device" "$work/rank0.log" "$work/rank1.log"
for rank in 0 1; do
  check "rank $rank names the full disk or the rank that met it" \
    grep -q -E "No space left on device|failed on rank\(s\)" "$work/rank$rank.log"
done
check "the tracker still names iteration 2" test "$(cat "$work/disk/ckpt/latest_checkpointed_iteration.txt")" = 2
check "iteration 2 is complete" test -f "$work/disk/ckpt/iter_0000002/metadata.json"
check "no temporary file is left" test -z "$(find "$work/disk" -name '*.tmp')"

# A disk too small for even one checkpoint: refused before training, exit 2, nothing written.
mkdir "$work/tiny"
mount -t tmpfs -o size=2m tmpfs "$work/tiny"
status=0
"$program" "${common[@]}" train.train_iters=4 checkpoint.save="$work/tiny/ckpt" >"$work/tiny.log" 2>&1 || status=$?
umount "$work/tiny"
check "a disk without room for one checkpoint exits 2 before training (exit $status)" test "$status" -eq 2
check "it says how much one checkpoint needs" grep -q "checkpoint.save: one checkpoint needs about" "$work/tiny.log"

cp -r "$work/disk/ckpt" "$work/roomy"
status=0
"$program" "${common[@]}" train.train_iters=4 checkpoint.save="$work/roomy" >"$work/resume.log" 2>&1 || status=$?
check "the first checkpoint resumes to the end (exit $status)" test "$status" -eq 0
check "it resumed from iteration 2" grep -q "iteration 2" "$work/resume.log"
check "the tracker names iteration 4" test "$(cat "$work/roomy/latest_checkpointed_iteration.txt")" = 4
check "iteration 4 is complete" test -f "$work/roomy/iter_0000004/metadata.json"
if ((failures > 0)); then
  for log in "$work"/*.log; do
    echo "--- $log (end)"
    tail -n 20 "$log"
  done
  exit 1
fi
echo "disk full: ok"
