#!/usr/bin/env bash
# SIGKILL trials for checkpoint saving: runs bridge-pretrain with a checkpoint after every step (synchronous and
# checkpoint.async_save alternately, every third trial with checkpoint.most_recent_k=2), kills it with SIGKILL at a
# random moment, then checks that latest_checkpointed_iteration.txt, when present, names a complete checkpoint that a
# new run resumes from and trains on. The model is small, so most of each step is spent saving and most kills land
# inside a save. The suite runs 20 trials (ctest -R checkpoint.kill_trials); the issue's figure is 100:
#   bench/checkpoint_kill_trials.sh build/tools/bridge-pretrain 100
# Usage: bench/checkpoint_kill_trials.sh <bridge-pretrain> [trials] [seed]
# Prints one line per trial and a summary; exits 1 when any trial's tracker named a checkpoint that did not resume.
set -euo pipefail
program=${1:?usage: $0 <bridge-pretrain> [trials] [seed]}
trials=${2:-100}
RANDOM=${3:-1234}
[[ -x "$program" ]] || { echo "no program $program: build the bridge-pretrain target first" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/bridge_kill_trials.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Random tokens (no corpus to prepare), no evaluation, a save every step.
common=(dataset.data_path=[] train.eval_iters=0 train.train_iters=100000 checkpoint.save_interval=1
  logging.log_interval=1000)
before_first=0
resumed=0
failed=0
for ((trial = 1; trial <= trials; trial++)); do
  dir="$work/trial_$trial"
  async=$((trial % 2 == 0 ? 1 : 0))
  keep=$((trial % 3 == 0 ? 2 : -1))
  # Start-up takes ~0.3 s on 2 cores; the kill comes 0.3 to 1.5 s after the start, inside the first ~15 saves.
  delay_ms=$((300 + RANDOM % 1200))
  options=(checkpoint.save="$dir" checkpoint.async_save=$([[ $async == 1 ]] && echo true || echo false)
    checkpoint.most_recent_k=$keep)
  "$program" "${common[@]}" "${options[@]}" >"$dir.train.log" 2>&1 &
  pid=$!
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  what="trial $trial (async_save=$async most_recent_k=$keep, killed at ${delay_ms} ms)"

  if [[ ! -f "$dir/latest_checkpointed_iteration.txt" ]]; then
    before_first=$((before_first + 1))
    echo "$what: killed before the first checkpoint was complete"
    continue
  fi
  latest=$(<"$dir/latest_checkpointed_iteration.txt")
  next=$((latest + 1))
  # The resumed run loads on every rank, checks every tensor against the model, then trains one step and saves it.
  if "$program" "${common[@]/train.train_iters=100000/train.train_iters=$next}" checkpoint.save="$dir" \
    >"$dir.resume.log" 2>&1 &&
    grep -q "loaded checkpoint .*iter_$(printf '%07d' "$latest") at iteration $latest" "$dir.resume.log" &&
    [[ $(<"$dir/latest_checkpointed_iteration.txt") == "$next" ]]; then
    resumed=$((resumed + 1))
    echo "$what: tracker at $latest, resumed to $next"
  else
    failed=$((failed + 1))
    echo "$what: FAILED: tracker at $latest did not resume; the resume's log:"
    tail -n 20 "$dir.resume.log"
  fi
  rm -rf "$dir"
done
echo "kill trials: $trials, killed before the first checkpoint: $before_first, resumed: $resumed, failed: $failed"
[[ $failed == 0 ]]
