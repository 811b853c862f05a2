#!/usr/bin/env bash
# SIGKILL trials for checkpoint saving: runs bridge-pretrain with a checkpoint after every step (synchronous and
# checkpoint.async_save alternately, every third trial with checkpoint.most_recent_k=2), waits for its first complete
# checkpoint, kills it with SIGKILL 0 to 1 s later, then checks that latest_checkpointed_iteration.txt names a
# complete checkpoint that a new run resumes from and trains on. The model is small, so most of each step is spent
# saving and most kills land inside a save. The suite runs 12 trials (ctest -R checkpoint.kill_trials); the issue's
# figure is 100:
#   bench/checkpoint_kill_trials.sh build/tools/bridge-pretrain 100
#   bench/checkpoint_kill_trials.sh build/tools/bridge-pretrain 20 1234 checkpoint.ckpt_format=torch_dist
# With --ranks N (N > 1) every run is a job of N ranks under a launcher (--launcher: .venv/bin/torchrun by default,
# or mpirun) with the distributed optimizer, and ONE rank is killed: rank 0 (which writes .metadata and the tracker)
# and the others in turn, each with synchronous and asynchronous saves. Then the launcher must end the job within
# --hang-limit seconds (60) with no rank left running, `bridge-checkpoint verify` must pass on the checkpoint the
# tracker names, and a job of N ranks must resume from it and train on (ctest -R checkpoint.kill_trials_2ranks runs 2):
#   bench/checkpoint_kill_trials.sh --ranks 2 build/tools/bridge-pretrain 20
#   bench/checkpoint_kill_trials.sh --ranks 2 --launcher mpirun build/tools/bridge-pretrain 20
# Usage: bench/checkpoint_kill_trials.sh [--ranks N] [--launcher torchrun|mpirun|PATH] [--hang-limit S]
#            <bridge-pretrain> [trials] [seed] [key=value ...]  (the overrides go to every run: the killed one and the
# resume)
# Prints one line per trial (whether the kill landed inside a save: an iteration directory newer than the tracker was
# on disk at the kill, or was left, or a *.tmp file) and a summary; exits 1 when a trial fails: the run did not start saving, did not die of the
# SIGKILL, outlived it (a rank or the launcher still running), or left a tracker naming a checkpoint that does not
# verify or resume.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage="usage: $0 [--ranks N] [--launcher torchrun|mpirun|PATH] [--hang-limit S] <bridge-pretrain> [trials] [seed] [key=value ...]"
ranks=1
launcher=
hang_limit=60
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --ranks) ranks=${2:?$usage}; shift 2 ;;
    --launcher) launcher=${2:?$usage}; shift 2 ;;
    --hang-limit) hang_limit=${2:?$usage}; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
program=${1:?$usage}
trials=${2:-100}
RANDOM=${3:-1234}
overrides=("${@:4}")
[[ -x "$program" ]] || { echo "no program $program: build the bridge-pretrain target first" >&2; exit 2; }
[[ $ranks =~ ^[1-9][0-9]*$ ]] || { echo "$usage" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/bridge_kill_trials.XXXXXX")
pid=
rank_pids=()
# Whatever ends the script (ctest's timeout, ^C, an error) ends the job in flight too: the launcher and its children
# (torchrun starts each rank in a session of its own, outside the launcher's process group) and the ranks found.
cleanup() {
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    local job=("$pid" $(pgrep -P "$pid" 2>/dev/null) ${rank_pids[@]+"${rank_pids[@]}"})
    kill -TERM "${job[@]}" 2>/dev/null || true
    sleep 1
    kill -KILL "${job[@]}" $(pgrep -P "$pid" 2>/dev/null) 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Random tokens (no corpus to prepare), no evaluation, a save every step.
common=(dataset.data_path=[] train.eval_iters=0 checkpoint.save_interval=1 logging.log_interval=1000)
launch=()
if ((ranks > 1)); then
  common+=(optimizer.use_distributed_optimizer=true ddp.use_distributed_optimizer=true)
  launcher=${launcher:-$here/../.venv/bin/torchrun}
  [[ $launcher == mpirun || $launcher == torchrun ]] && launcher=$(command -v "$launcher" || echo "$launcher")
  [[ -x $launcher ]] || { echo "no launcher $launcher (bridge's torchrun is .venv/bin/torchrun)" >&2; exit 2; }
  checkpoint_tool=$(dirname "$program")/bridge-checkpoint
  [[ -x $checkpoint_tool ]] || { echo "no $checkpoint_tool: build the bridge-checkpoint target first" >&2; exit 2; }
  if [[ $(basename "$launcher") == mpirun ]]; then
    launch=("$launcher" --allow-run-as-root --oversubscribe -np "$ranks")
  else
    # --standalone: the agent's store on a free port, so trials may run beside other jobs.
    launch=("$launcher" --standalone --nproc-per-node "$ranks" --no_python)
  fi
fi
common+=(${overrides[@]+"${overrides[@]}"})
# The process of rank $1 of the job started as $pid: the job itself alone, else the launcher's child whose
# environment says that rank (torchrun's RANK, Open MPI's OMPI_COMM_WORLD_RANK).
rank_pid() {
  if ((ranks == 1)); then echo "$pid"; return; fi
  local child
  for child in $(pgrep -P "$pid"); do
    if tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qxE "(RANK|OMPI_COMM_WORLD_RANK)=$1"; then
      echo "$child"
      return
    fi
  done
}
now_ms() { date +%s%3N; }
# Whether a save is under way: an iteration directory newer than the one the tracker names.
saving() {
  local tracked newest=0 d n
  tracked=$(<"$dir/latest_checkpointed_iteration.txt") || return 1
  for d in "$dir"/iter_*; do
    n=${d##*/iter_}
    [[ $n =~ ^[0-9]+$ ]] && ((10#$n > newest)) && newest=$((10#$n))
  done
  ((newest > 10#$tracked))
}
resumed=0
failed=0
inside=0
slowest_end_ms=0
fail() {
  failed=$((failed + 1))
  echo "$what: FAILED: $1; the log's end:"
  tail -n 15 "$2"
}
for ((trial = 1; trial <= trials; trial++)); do
  dir="$work/trial_$trial"
  keep=$((trial % 3 == 0 ? 2 : -1))
  # Over each run of 2 * ranks trials, every rank is killed once with each kind of save: the ranks in turn, the kind
  # of save flipping for a rank from one pass over them to the next (one process: synchronous, then asynchronous).
  victim=$(((trial - 1) % ranks))
  async=$([[ $(((victim + (trial - 1) / ranks) % 2)) == 1 ]] && echo true || echo false)
  delay_ms=$((RANDOM % 1000))
  if ((ranks == 1)); then
    what="trial $trial (async_save=$async most_recent_k=$keep, killed ${delay_ms} ms after the first checkpoint)"
  else
    # Three trials in four are aimed at a save: the kill comes 0 to 25 ms after the first save that starts once the
    # delay is over (a save of this model takes some 30 to 60 ms); the fourth is killed wherever the delay ends.
    aim_ms=$((RANDOM % 25))
    ((trial % 4 == 0)) && aim_ms=
    what="trial $trial (async_save=$async most_recent_k=$keep, rank $victim of $ranks killed ${delay_ms} ms after the first checkpoint${aim_ms:+ and $aim_ms ms into the next save})"
  fi
  ${launch[@]+"${launch[@]}"} "$program" "${common[@]}" train.train_iters=100000 checkpoint.save="$dir" \
    checkpoint.async_save=$async checkpoint.most_recent_k=$keep >"$work/train.log" 2>&1 &
  pid=$!
  # Up to 60 s for start-up and the first checkpoint, however busy the machine.
  for ((polls = 0; polls < 3000; polls++)); do
    [[ ! -f "$dir/latest_checkpointed_iteration.txt" ]] && kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
  if ((ranks == 1)); then
    sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
    saving_at_kill=$(saving && echo 1 || true)
    kill -KILL "$pid" 2>/dev/null || true
    status=0
    wait "$pid" 2>/dev/null || status=$?
    if [[ $status != 137 ]]; then
      fail "the run ended with status $status before the SIGKILL" "$work/train.log"
      continue
    fi
  else
    rank_pids=()
    for ((r = 0; r < ranks; r++)); do rank_pids+=("$(rank_pid $r)"); done
    target=${rank_pids[victim]}
    sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
    if [[ -n $aim_ms ]]; then
      # Aimed: up to 5 s for the next save to start (an iteration directory newer than the tracker), then the kill.
      for ((polls = 0; polls < 1000; polls++)); do
        saving && break
        sleep 0.005
      done
      sleep "0.$(printf '%03d' "$aim_ms")"
    fi
    saving_at_kill=$(saving && echo 1 || true)
    if [[ -z $target ]] || ! kill -KILL "$target" 2>/dev/null; then
      kill -KILL "$pid" ${rank_pids[@]+"${rank_pids[@]}"} 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      fail "rank $victim ended (or never started) before the SIGKILL" "$work/train.log"
      continue
    fi
    killed_ms=$(now_ms)
    # The launcher must end the job: no rank may wait on the dead one.
    while kill -0 "$pid" 2>/dev/null && (($(now_ms) - killed_ms < hang_limit * 1000)); do sleep 0.02; done
    end_ms=$(($(now_ms) - killed_ms))
    hung=
    kill -0 "$pid" 2>/dev/null && hung="the launcher"
    for ((r = 0; r < ranks; r++)); do
      # A rank may take a moment longer than its launcher to be reaped.
      for ((polls = 0; polls < 100; polls++)); do kill -0 "${rank_pids[r]}" 2>/dev/null || break; sleep 0.05; done
      kill -0 "${rank_pids[r]}" 2>/dev/null && hung+="${hung:+, }rank $r"
    done
    if [[ -n $hung ]]; then
      kill -KILL "$pid" "${rank_pids[@]}" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      fail "$hung still running ${hang_limit} s after rank $victim was killed" "$work/train.log"
      continue
    fi
    status=0
    wait "$pid" 2>/dev/null || status=$?
    if [[ $status == 0 ]]; then
      fail "the launcher exited 0 after rank $victim was killed" "$work/train.log"
      continue
    fi
    ((end_ms > slowest_end_ms)) && slowest_end_ms=$end_ms
  fi
  if [[ ! -f "$dir/latest_checkpointed_iteration.txt" ]]; then
    fail "no checkpoint within 60 s" "$work/train.log"
    continue
  fi
  latest=$(<"$dir/latest_checkpointed_iteration.txt")
  next=$((latest + 1))
  # Inside a save: an iteration newer than the tracker was on disk when the kill came (the survivors of a job may
  # remove it as their save fails), or the kill left one, or a file under its temporary name.
  where="between saves"
  [[ -n $saving_at_kill ]] && where="inside a save"
  for leftover in "$dir"/iter_* "$dir"/*.tmp* "$dir"/*/*.tmp*; do
    [[ -e $leftover ]] || continue
    name=${leftover#"$dir"/iter_}
    if [[ $leftover == *.tmp* ]] || { [[ $name =~ ^[0-9]+$ ]] && ((10#$name > latest)); }; then
      where="inside a save"
      break
    fi
  done
  [[ $where == "inside a save" ]] && inside=$((inside + 1))
  if ((ranks > 1)) && ! "$checkpoint_tool" verify "$dir" >"$work/verify.log" 2>&1; then
    fail "bridge-checkpoint verify refused iteration $latest, which the tracker names" "$work/verify.log"
    continue
  fi
  # The resumed run loads on every rank, checks every tensor against the model, then trains one step and saves it.
  timeout -k 10 120 ${launch[@]+"${launch[@]}"} "$program" "${common[@]}" train.train_iters=$next \
    checkpoint.save="$dir" >"$work/resume.log" 2>&1 &
  pid=$!
  rank_pids=()
  resume_status=0
  wait "$pid" || resume_status=$?
  if ((resume_status == 0)) &&
    grep -q "loaded checkpoint .*iter_$(printf '%07d' "$latest") at iteration $latest" "$work/resume.log" &&
    [[ $(<"$dir/latest_checkpointed_iteration.txt") == "$next" ]]; then
    resumed=$((resumed + 1))
    if ((ranks == 1)); then
      echo "$what: $where, tracker at $latest, resumed to $next"
    else
      echo "$what: $where, job ended $end_ms ms after the kill, tracker at $latest verified, resumed to $next"
    fi
  else
    fail "the tracker named iteration $latest, which did not resume" "$work/resume.log"
  fi
  rm -rf "$dir"
done
if ((ranks == 1)); then
  echo "kill trials: $trials, inside a save: $inside, resumed: $resumed, failed: $failed"
else
  echo "kill trials of $ranks ranks: $trials, inside a save: $inside, resumed: $resumed, failed: $failed, slowest end after the kill: $slowest_end_ms ms"
fi
[[ $failed == 0 ]]
