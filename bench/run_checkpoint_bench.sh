#!/usr/bin/env bash
# Checkpoint save and load, `checkpoint.ckpt_format` torch (Megatron's legacy layout: data-parallel rank 0 gathers the
# distributed optimizer's shards and writes mp_rank_XX/model_optim_rng.pt) against torch_dist (every rank writes its
# own __<rank>_0.distcp), per layout (dp1, dp2, dp4, tp2xdp2 by default): a GPT of GPT-2 124M's shape (12 layers x
# 768, 12 heads, ffn 3072, vocab 50257 on mock data: the repository has no GPT-2 tokenizer offline, and the embedded
# corpus's byte vocabulary would shrink the embedding), fp32, the distributed optimizer, micro-batch 1, the sequence of
# examples/recipes/tiny.yaml (64; --seq 1024 for GPT-2's context, whose step activations then lift every rank's peak
# above what a save adds, hiding it). Each rank runs under `.venv/bin/torchrun --no_python` and `/usr/bin/time` (its
# peak RSS). Per layout and format, three runs of bridge-pretrain (builds nothing: build bridge-pretrain first):
#   base  1 training step, no checkpoint (one per layout, shared by the formats; --no-baseline skips it): each rank's
#         peak RSS without a save or a load
#   save  1 training step, then the save at the end of training
#   load  checkpoint.load of that save, then 1 more step (train_iters 2)
# and reports:
#   save (s)   bridge's own log line "saved checkpoint iteration 1 to DIR (X s)" (rank 0: from the save's start to its
#              commit, every rank's writes included)
#   load (s)   from rank 0's "resuming from checkpoint ..." to its "loaded checkpoint ... at iteration 1", timed by
#              this script as the lines arrive (bridge logs no duration for a load; its log's timestamps are whole
#              seconds). The files were just written, so the load reads them from the page cache.
#   MB written per rank   the checkpoint's file sizes by writer: __<r>_0.distcp to rank r, mp_rank_TT[_PPP]/* to
#              data-parallel rank 0 of that (tp, pp) (global rank pp*tp*dp + tt in the order tp-cp-ep-dp-pp), every
#              other file (.metadata, metadata.json, common.pt, train_state.pt, the tracker...) to rank 0
#   peak RSS   /usr/bin/time's maximum resident set of each rank's process over the whole run, for the save run and
#              the load run, and the save run's rise over the base run (what the save added to the step's peak)
# MB are 10^6 bytes throughout (RSS: /usr/bin/time's KiB x 1024). Prints the Markdown table, then the raw numbers.
# A full run (GPT-2 size, 4 layouts x 2 formats) writes about 1.5 GB a checkpoint and takes minutes per layout on a
# 2-core machine; each checkpoint is deleted once measured unless --keep.
#
# Usage: bench/run_checkpoint_bench.sh [options]
#   --build DIR              build directory (build)
#   --layouts "dp1 dp2 dp4 tp2xdp2"   layouts, each tpT x ppP x dpD in any order, sizes of 1 left out
#   --formats "torch torch_dist"      checkpoint.ckpt_format values
#   --seq N                  model.seq_length (64, the tiny recipe's)
#   --small                  a tiny model (2 layers x 64, vocab 1000) for a smoke run of a few seconds a run
#   --no-baseline            skip the base runs (no "rise" column)
#   --keep                   keep the work directory (checkpoints, each run's log and /usr/bin/time output)
#   --                       the rest are bridge-pretrain overrides added to every run (e.g. checkpoint.async_save=true)
# The work directory is a new one under $TMPDIR (/tmp), removed at the end unless --keep.
set -euo pipefail
build=build
layouts="dp1 dp2 dp4 tp2xdp2"
formats="torch torch_dist"
seq=64
small=0
baseline=1
keep=0
extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --layouts) layouts=$2; shift 2 ;;
    --formats) formats=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --small) small=1; shift ;;
    --no-baseline) baseline=0; shift ;;
    --keep) keep=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
repo=$PWD
[[ $build == /* ]] || build="$repo/$build"
program="$build/tools/bridge-pretrain"
torchrun="$repo/.venv/bin/torchrun"
python="$repo/.venv/bin/python"
[[ -x "$program" ]] || { echo "no $program: cmake --build $build --target bridge-pretrain" >&2; exit 1; }
[[ -x "$torchrun" ]] || { echo "no $torchrun (the tests' venv)" >&2; exit 1; }
[[ -x /usr/bin/time ]] || { echo "no /usr/bin/time (apt-get install time)" >&2; exit 1; }
for format in $formats; do
  [[ $format == torch || $format == torch_dist ]] || { echo "unknown format $format (torch, torch_dist)" >&2; exit 2; }
done

if ((small)); then
  model=(model.num_layers=2 model.hidden_size=64 model.num_attention_heads=4 model.ffn_hidden_size=256
    model.vocab_size=1000)
else
  model=(model.num_layers=12 model.hidden_size=768 model.num_attention_heads=12 model.ffn_hidden_size=3072
    model.vocab_size=50257)
fi
# Mock data, no evaluation, the distributed optimizer, fp32 (the tiny recipe's default precision).
common=(--config "$repo/examples/recipes/tiny.yaml" "${model[@]}" model.seq_length="$seq" 'dataset.data_path=[]'
  train.micro_batch_size=1 train.eval_iters=0 ddp.use_distributed_optimizer=true
  optimizer.use_distributed_optimizer=true)

work=$(mktemp -d "${TMPDIR:-/tmp}/checkpoint_bench.XXXXXX")
if ((keep)); then
  trap 'echo "kept $work"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi

# Prefixes each line with the time it arrived (seconds since the epoch, microseconds).
stamp() {
  local line
  while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done
}
free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# run DIR RANKS OVERRIDES...: bridge-pretrain on RANKS ranks; DIR/log (stamped), DIR/rss.<rank> ("maxrss_kb wall_s").
run() {
  local dir=$1 ranks=$2
  shift 2
  mkdir -p "$dir"
  # shellcheck disable=SC2016  # $RANK and $@ are the rank's shell's
  if ! (cd "$dir" && "$torchrun" --nproc_per_node "$ranks" --master_addr 127.0.0.1 --master_port "$(free_port)" \
      --no_python bash -c 'exec /usr/bin/time -o "rss.$RANK" -f "%M %e" "$@"' rank \
      "$program" "${common[@]}" "$@" "${extra[@]}" 2>&1 | stamp >log); then
    echo "failed ($dir): $program ${common[*]} $* ${extra[*]}" >&2
    tail -30 "$dir/log" >&2
    exit 1
  fi
}

echo "bridge-pretrain: $program; work directory $work"
echo "model: ${model[*]} model.seq_length=$seq, mock data, fp32, distributed optimizer, micro-batch 1"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for layout in $layouts; do
  tp=1 pp=1 dp=1
  IFS=x read -ra axes <<<"$layout"
  for axis in "${axes[@]}"; do
    case $axis in
      tp[0-9]*) tp=${axis#tp} ;;
      pp[0-9]*) pp=${axis#pp} ;;
      dp[0-9]*) dp=${axis#dp} ;;
      *) echo "bad layout $layout (e.g. dp4, tp2xdp2, tp2xpp2xdp2)" >&2; exit 2 ;;
    esac
  done
  ranks=$((tp * pp * dp))
  sizes=(parallelism.tensor_model_parallel_size="$tp" parallelism.pipeline_model_parallel_size="$pp"
    train.global_batch_size="$dp")
  echo "$layout" "$tp" "$pp" "$dp" >>"$work/layouts"
  if ((baseline)); then
    run "$work/$layout/base" "$ranks" "${sizes[@]}" train.train_iters=1
  fi
  for format in $formats; do
    dir="$work/$layout/$format"
    ckpt="$dir/ckpt"
    run "$dir/save" "$ranks" "${sizes[@]}" train.train_iters=1 checkpoint.ckpt_format="$format" \
      checkpoint.save="$ckpt"
    (cd "$ckpt" && find . -type f -printf '%P %s\n') >"$dir/files"
    run "$dir/load" "$ranks" "${sizes[@]}" train.train_iters=2 checkpoint.ckpt_format="$format" \
      checkpoint.load="$ckpt"
    ((keep)) || rm -rf "$ckpt"
    echo "  $layout $format done"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$work" "$formats" "$baseline" <<'PY'
import os
import re
import sys

work, formats, baseline = sys.argv[1], sys.argv[2].split(), sys.argv[3] == "1"


def peaks(run_dir):
    """Each rank's (peak RSS in MB, wall s) from /usr/bin/time -f '%M %e'."""
    result = {}
    for name in os.listdir(run_dir):
        if name.startswith("rss."):
            words = open(os.path.join(run_dir, name)).read().split()
            # /usr/bin/time writes "Command exited with non-zero status N" first when the rank failed
            result[int(name[4:])] = (int(words[-2]) * 1024 / 1e6, float(words[-1]))
    return [result[rank] for rank in sorted(result)]


def stamped(run_dir, pattern):
    """(arrival time, match) of the first log line matching pattern."""
    for line in open(os.path.join(run_dir, "log"), errors="replace"):
        stamp, _, text = line.partition(" ")
        found = re.search(pattern, text)
        if found:
            return float(stamp), found
    sys.exit(f"no line matching {pattern!r} in {run_dir}/log")


def written(files, ranks, tp, pp, dp):
    """Bytes written by each rank, from the checkpoint's file sizes and names."""
    out = [0] * ranks
    for line in open(files):
        path, size = line.rsplit(" ", 1)
        name = os.path.basename(path)
        parts = path.split("/")
        shard = re.fullmatch(r"__(\d+)_\d+\.distcp", name)
        legacy = next((re.fullmatch(r"mp_rank_(\d+)(?:_(\d+))?", p) for p in parts if p.startswith("mp_rank_")), None)
        if shard:
            rank = int(shard.group(1))
        elif legacy:  # data-parallel rank 0 of (tp, pp), in the order tp-cp-ep-dp-pp
            rank = int(legacy.group(2) or 0) * tp * dp + int(legacy.group(1))
        else:
            rank = 0
        out[rank] += int(size)
    return out


def listing(values, digits=0):
    return ", ".join(f"{v:.{digits}f}" for v in values)


rows, raw = [], []
for line in open(os.path.join(work, "layouts")):
    layout, tp, pp, dp = line.split()
    tp, pp, dp = int(tp), int(pp), int(dp)
    ranks = tp * pp * dp
    base = peaks(os.path.join(work, layout, "base")) if baseline else None
    if base:
        raw.append(f"{layout} base peak_rss_mb=[{listing([p[0] for p in base], 1)}] "
                   f"wall_s=[{listing([p[1] for p in base], 2)}]")
    for fmt in formats:
        d = os.path.join(work, layout, fmt)
        _, saved = stamped(os.path.join(d, "save"), r"saved checkpoint iteration \d+ to \S+ \(([0-9.]+) s\)")
        save_s = float(saved.group(1))
        began, _ = stamped(os.path.join(d, "load"), r"(resuming from|loading the weights of) checkpoint ")
        ended, _ = stamped(os.path.join(d, "load"), r"loaded checkpoint \S+ at iteration 1\b")
        stamped(os.path.join(d, "load"), r"iteration\s+2/\s*2 ")  # it trained on after the load
        load_s = ended - began
        bytes_ = written(os.path.join(d, "files"), ranks, tp, pp, dp)
        save_peak, load_peak = peaks(os.path.join(d, "save")), peaks(os.path.join(d, "load"))
        rise = listing([s[0] - b[0] for s, b in zip(save_peak, base)]) if base else "-"
        rows.append(f"| {layout} | {ranks} | {fmt} | {save_s:.2f} | {load_s:.2f} | {listing([b / 1e6 for b in bytes_], 1)} "
                    f"| {listing([p[0] for p in save_peak])} | {rise} | {listing([p[0] for p in load_peak])} |")
        raw.append(f"{layout} {fmt} save_s={save_s:.3f} load_s={load_s:.3f} bytes=[{listing(bytes_)}] "
                   f"save_peak_rss_mb=[{listing([p[0] for p in save_peak], 1)}] "
                   f"save_wall_s=[{listing([p[1] for p in save_peak], 2)}] "
                   f"load_peak_rss_mb=[{listing([p[0] for p in load_peak], 1)}] "
                   f"load_wall_s=[{listing([p[1] for p in load_peak], 2)}]")
print()
print("| layout | ranks | format | save (s) | load (s) | MB written per rank | save run's peak RSS per rank (MB) "
      "| rise over the no-save run (MB) | load run's peak RSS per rank (MB) |")
print("|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
print()
print("Per-rank values are in rank order (rank 0 first). Raw numbers:")
print("\n".join("  " + line for line in raw))
PY
