#!/usr/bin/env bash
# SIGKILL trials for checkpoint saving: runs bridge-pretrain with a checkpoint after every step (synchronous and
# checkpoint.async_save alternately, every third trial with checkpoint.most_recent_k=2), waits for its first complete
# checkpoint, kills it with SIGKILL 0 to 1 s later, then checks that latest_checkpointed_iteration.txt names a
# complete checkpoint that a new run resumes from and trains on. The model is small, so most of each step is spent
# saving and most kills land inside a save. The suite runs 20 trials (ctest -R checkpoint.kill_trials); the issue's
# figure is 100:
#   bench/checkpoint_kill_trials.sh build/tools/bridge-pretrain 100
#   bench/checkpoint_kill_trials.sh build/tools/bridge-pretrain 20 1234 checkpoint.ckpt_format=torch_dist
# Usage: bench/checkpoint_kill_trials.sh <bridge-pretrain> [trials] [seed] [key=value ...]  (the overrides go to every
# run: the killed one and the resume)
# Prints one line per trial and a summary; exits 1 when a trial fails: the run did not start saving, did not die of
# the SIGKILL, or left a tracker naming a checkpoint that does not resume.
set -euo pipefail
program=${1:?usage: $0 <bridge-pretrain> [trials] [seed]}
trials=${2:-100}
RANDOM=${3:-1234}
overrides=("${@:4}")
[[ -x "$program" ]] || { echo "no program $program: build the bridge-pretrain target first" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/bridge_kill_trials.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Random tokens (no corpus to prepare), no evaluation, a save every step.
common=(dataset.data_path=[] train.eval_iters=0 checkpoint.save_interval=1 logging.log_interval=1000 ${overrides[@]+"${overrides[@]}"})
resumed=0
failed=0
fail() {
  failed=$((failed + 1))
  echo "$what: FAILED: $1; the log's end:"
  tail -n 15 "$2"
}
for ((trial = 1; trial <= trials; trial++)); do
  dir="$work/trial_$trial"
  async=$([[ $((trial % 2)) == 0 ]] && echo true || echo false)
  keep=$((trial % 3 == 0 ? 2 : -1))
  delay_ms=$((RANDOM % 1000))
  what="trial $trial (async_save=$async most_recent_k=$keep, killed ${delay_ms} ms after the first checkpoint)"
  "$program" "${common[@]}" train.train_iters=100000 checkpoint.save="$dir" checkpoint.async_save=$async \
    checkpoint.most_recent_k=$keep >"$work/train.log" 2>&1 &
  pid=$!
  # Up to 60 s for start-up and the first checkpoint, however busy the machine.
  for ((polls = 0; polls < 3000; polls++)); do
    [[ ! -f "$dir/latest_checkpointed_iteration.txt" ]] && kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  kill -KILL "$pid" 2>/dev/null || true
  status=0
  wait "$pid" 2>/dev/null || status=$?
  if [[ $status != 137 ]]; then
    fail "the run ended with status $status before the SIGKILL" "$work/train.log"
    continue
  fi
  if [[ ! -f "$dir/latest_checkpointed_iteration.txt" ]]; then
    fail "no checkpoint within 60 s" "$work/train.log"
    continue
  fi
  latest=$(<"$dir/latest_checkpointed_iteration.txt")
  next=$((latest + 1))
  # The resumed run loads on every rank, checks every tensor against the model, then trains one step and saves it.
  if timeout 120 "$program" "${common[@]}" train.train_iters=$next checkpoint.save="$dir" >"$work/resume.log" 2>&1 &&
    grep -q "loaded checkpoint .*iter_$(printf '%07d' "$latest") at iteration $latest" "$work/resume.log" &&
    [[ $(<"$dir/latest_checkpointed_iteration.txt") == "$next" ]]; then
    resumed=$((resumed + 1))
    echo "$what: tracker at $latest, resumed to $next"
  else
    fail "the tracker named iteration $latest, which did not resume" "$work/resume.log"
  fi
  rm -rf "$dir"
done
echo "kill trials: $trials, resumed: $resumed, failed: $failed"
[[ $failed == 0 ]]
