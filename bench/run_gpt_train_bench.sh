#!/usr/bin/env bash
# GPT training throughput: bridge's pretrain() in C++ (gpt_train_bench) against the same model and step in Python
# PyTorch eager (gpt_train_bench.py) on the SAME LibTorch the build uses (a build against a PyPI wheel runs that venv's
# python; one against Debian's LibTorch runs /usr/bin/python3), and both against the machine's GEMM peak through that
# LibTorch (gemm_peak_bench), for a small GPT, GPT-2 124M (micro-batch 4, seq 64) and a Llama-style model of that size
# (12 layers, hidden 768, 12 heads in 4 key/value groups, SwiGLU of 2048, RoPE, RMSNorm, untied; Python's side is
# transformers' LlamaForCausalLM, bench/llama_train_bench.py), per thread count and dtype; --compile adds Python under
# torch.compile as a third side. qwen3-moe-150M (not in the default set) is a Qwen3-MoE-shaped model of 153M
# parameters (the Llama block with q/k RMSNorm, hidden 768, every MLP 8 SwiGLU experts of width 384 with top-2
# routing, the load-balancing loss at 1e-3 on both sides, vocab 32000) against transformers' Qwen3MoeForCausalLM
# (bench/qwen3_moe_train_bench.py) in eager PyTorch, twice: with transformers' default experts kernel (grouped_mm, the
# "Py" columns) and with its eager per-expert loop ("python_eager", printed under the table).
# Builds nothing: build gpt_train_bench and gemm_peak_bench (and adamw_step_bench for --adamw) first. Each round runs
# the GEMM probe, C++, Python, so that drift in the machine's load hits all three alike. Prints per row the median
# tokens/s of each side (min-max over the rounds), the ratio C++/Python of the medians (above 1: C++ is faster), each
# side's model FLOP/s as a percentage of the sustained fp32 GEMM peak at that thread count, and each side's peak
# resident memory; then each side's speed-up from 1 to 2 threads and bf16's speed against fp32.
#
# Usage: bench/run_gpt_train_bench.sh [options]
#   --build DIR            build directory (build)
#   --python PY            the Python to compare with (default: the one whose torch the build links)
#   --threads "1 2"        intra-op thread counts, one table row each (1 2)
#   --rounds N             alternating rounds per row (3)
#   --configs "small gpt2-124M llama-124M"   which models (these three; also qwen3-moe-150M)
#   --dtypes "fp32 bf16"   bf16: Python's model in bfloat16, bridge's bf16_mixed recipe (fp32 bf16)
#   --attention            also time both sides with the explicit softmax attention (--attention unfused)
#   --adamw                also time the optimizer step alone on 124M parameters (adamw_step_bench{,.py})
#   --compile              also time Python's model under torch.compile (compiling takes its first, untimed steps)
#   --wait-idle SECONDS    before each run, wait up to SECONDS for the machine to go idle (no other runnable task over
#                          2 s); on a shared machine, where others' builds would slow one side's run and not the other's
# Each run's line gets busy=<other runnable tasks, mean over the run> (from /proc/stat's procs_running, less this
# run's threads); the table's "busy" column is its median over the row's runs: 0 on an idle machine, 2 when two other
# jobs kept both cores of this 2-core machine busy throughout.
set -euo pipefail
build=build
python=
thread_counts="1 2"
rounds=3
config_names="small gpt2-124M llama-124M"
dtypes="fp32 bf16"
compare_attention=0
adamw=0
compile=0
wait_idle=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --threads) thread_counts=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --configs) config_names=$2; shift 2 ;;
    --dtypes) dtypes=$2; shift 2 ;;
    --attention) compare_attention=1; shift ;;
    --adamw) adamw=1; shift ;;
    --compile) compile=1; shift ;;
    --wait-idle) wait_idle=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
cpp="$build/bench/gpt_train_bench"
gemm="$build/bench/gemm_peak_bench"
for program in "$cpp" "$gemm"; do
  [[ -x "$program" ]] || { echo "no $program: cmake --build $build --target $(basename "$program")" >&2; exit 1; }
done
if [[ -z "$python" ]]; then
  # Torch_DIR of a PyPI wheel is <venv>/lib/pythonX.Y/site-packages/torch/share/cmake/Torch.
  torch_dir=$(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
  if [[ "$torch_dir" == */lib/python*/site-packages/torch/* ]]; then
    python="${torch_dir%%/lib/python*}/bin/python"
  else
    python=/usr/bin/python3
  fi
fi
# --threads alone decides the intra-op threads; an inherited OMP_NUM_THREADS would override one side's default.
unset OMP_NUM_THREADS
echo "C++: $cpp ($(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt" 2>/dev/null))"
echo "Python: $python (torch $("$python" -c 'import torch; print(torch.__version__)'))"
echo "CPU: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores"

# name|flags: the small GPT steps in well under a second; GPT-2 124M (50257 -> 50304 vocab) takes seconds a step.
declare -A configs=(
  [small]="--layers 4 --hidden 256 --heads 4 --seq 128 --vocab 8192 --micro-batch 8 --steps 20 --warmup-steps 3"
  [gpt2-124M]="--layers 12 --hidden 768 --heads 12 --seq 64 --vocab 50257 --micro-batch 4 --steps 4 --warmup-steps 1"
  [llama-124M]="--block llama --layers 12 --hidden 768 --heads 12 --query-groups 4 --ffn 2048 --seq 64 --vocab 50257
    --micro-batch 4 --steps 4 --warmup-steps 2"
  [qwen3-moe-150M]="--block qwen3_moe --layers 12 --hidden 768 --heads 12 --query-groups 4 --experts 8 --topk 2
    --moe-ffn 384 --aux-loss 1e-3 --seq 64 --vocab 32000 --micro-batch 4 --steps 4 --warmup-steps 2"
)
sides=(cpp python)
((compile)) && sides+=(python_compile)
variants=(auto)
((compare_attention)) && variants+=(unfused)
results=$(mktemp)
samples=$(mktemp)
trap 'rm -f "$results" "$samples"' EXIT

running() {  # runnable tasks now, as the kernel counts them (this shell's read among them)
  local key value
  while read -r key value _; do
    [[ $key == procs_running ]] && { echo "$value"; return; }
  done </proc/stat
}
# Waits up to --wait-idle seconds until no other task was runnable in 10 samples over 2 s.
wait_for_idle() {
  ((wait_idle > 0)) || return 0
  local start=$SECONDS others i
  while ((SECONDS - start < wait_idle)); do
    others=0
    for ((i = 0; i < 10; ++i)); do
      others=$((others + $(running) - 1))
      sleep 0.2
    done
    if ((others <= 1)); then
      ((SECONDS - start > 2)) && echo "(waited $((SECONDS - start - 2)) s for an idle machine)"
      return 0
    fi
  done
  echo "(the machine stayed busy for $wait_idle s; running anyway)"
}
# Records procs_running every 0.2 s into $samples until killed.
sample_running() {
  : >"$samples"
  while :; do
    running >>"$samples"
    sleep 0.2
  done
}
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for name in $config_names; do
  flags=${configs[$name]:?unknown config $name (small, gpt2-124M, llama-124M, qwen3-moe-150M)}
  reference=bench/gpt_train_bench.py
  row_sides=("${sides[@]}")
  [[ $name == llama* ]] && reference=bench/llama_train_bench.py
  if [[ $name == qwen3-moe* ]]; then
    # Eager PyTorch only; transformers' default experts kernel and its per-expert loop.
    reference=bench/qwen3_moe_train_bench.py
    row_sides=(cpp python python_eager)
  fi
  for dtype in $dtypes; do
    for threads in $thread_counts; do
      for ((r = 0; r < rounds; ++r)); do
        wait_for_idle
        "$gemm" --threads "$threads" --dtype fp32 | tee -a "$results"
        for attention in "${variants[@]}"; do
          for side in "${row_sides[@]}"; do
            case $side in
              cpp) program=("$cpp") ;;
              python) program=("$python" "$reference") ;;
              python_compile) program=("$python" "$reference" --compile) ;;
              python_eager) program=("$python" "$reference" --experts-implementation eager) ;;
            esac
            # transformers' models are timed with SDPA only
            [[ ($name == llama* || $name == qwen3*) && $attention != auto ]] && continue
            # The block flags are the C++ side's; the Python side's model is the block.
            side_flags=$flags
            [[ $side != cpp ]] && side_flags=$(sed -E 's/--block [a-z0-9_]+ //' <<<"$flags")
            wait_for_idle
            sample_running &
            sampler=$!
            # shellcheck disable=SC2086
            line=$("${program[@]}" $side_flags --threads "$threads" --attention "$attention" --dtype "$dtype" \
              2>/dev/null | grep -E '^(cpp|python|python_compile|python_eager) tokens_per_s') || {
              kill "$sampler"
              echo "$side $name failed: ${program[*]} $flags --threads $threads --attention $attention" \
                "--dtype $dtype" >&2
              exit 1
            }
            kill "$sampler"
            wait "$sampler" 2>/dev/null || true
            # Others' runnable tasks: the samples less the sampler's read and this run's threads.
            busy=$(awk -v t="$threads" '{ s += $1 - 1 - t; n++ } END { printf "%.2f", n ? s / n : 0 }' "$samples")
            echo "$name $line busy=$busy" | tee -a "$results"
          done
        done
      done
    done
  done
done
if ((adamw)); then
  for threads in $thread_counts; do
    for ((r = 0; r < rounds; ++r)); do
      "$build/bench/adamw_step_bench" --threads "$threads" | grep '^cpp_adamw impl' | tee -a "$results"
      "$python" bench/adamw_step_bench.py --threads "$threads" | tee -a "$results"
    done
  done
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" - "$results" <<'PY'
import statistics
import sys

train, adamw, peak = {}, {}, {}  # row key -> list of one run's fields; threads -> fp32 GEMM GFLOP/s of each round
for line in open(sys.argv[1]):
    words = line.split()
    values = dict(w.split("=", 1) for w in words if "=" in w)
    if words[0] == "gemm_peak":  # a step lasts seconds: its yardstick is the sustained (median) GEMM rate
        peak.setdefault(values["threads"], []).append((float(values["median_gflops"]), float(values["gflops"])))
        continue
    if words[0] in ("cpp_adamw", "python_adamw"):
        adamw.setdefault((values["threads"], words[0].split("_")[0], values["impl"]), []).append(values)
        continue
    config, who = words[0], words[1]
    train.setdefault((config, values["threads"], values["attention"], values["dtype"]), {}).setdefault(who, []).append(
        values)


def spread(values, width=6):
    return f"{statistics.median(values):{width}.1f} ({min(values):.1f}-{max(values):.1f})"


def median_of(rows, field):
    return statistics.median(float(r[field]) for r in rows)


if peak:
    print("fp32 GEMM peak (2048^3 at::mm), GFLOP/s: median (min-max) over the rounds of each probe's median of 12 "
          "products, [and of its fastest product]")
    for threads, probes in sorted(peak.items()):
        print(f"  threads {threads}: {spread([p[0] for p in probes])} [{spread([p[1] for p in probes])}]")
speed = {}  # (config, threads, attention, dtype, side) -> median tokens/s
if train:
    print("tokens/s: median (min-max) over the rounds; C++/Py: ratio of the medians (C++/PyC: against Python under "
          "torch.compile, with --compile); ms: median step; %peak: model FLOP/s over the fp32 GEMM peak; MB: peak "
          "resident memory; busy: other runnable tasks during the runs, median (C++/Py); best: Py over C++ of each "
          "side's fastest step, median over the rounds (the step least slowed by other work); pair: the median of "
          "the rounds' own C++/Py (each round's two runs back to back)")
    print(f"{'config':<10} {'thr':>3} {'attention':<9} {'dtype':<5} {'C++ tok/s':>20} {'Py tok/s':>20} {'C++/Py':>6} "
          f"{'C++/PyC':>7} {'C++ ms':>7} {'Py ms':>7} {'C++%pk':>6} {'Py%pk':>6} {'C++ MB':>6} {'Py MB':>6} "
          f"{'busy':>9} {'best':>5} {'pair':>5} params")
for (config, threads, attention, dtype), sides in train.items():
    cpp, py = sides.get("cpp", []), sides.get("python", [])
    if not cpp or not py:
        continue
    cpp_tps = [float(r["tokens_per_s"]) for r in cpp]
    py_tps = [float(r["tokens_per_s"]) for r in py]
    for side, tps in (("cpp", cpp_tps), ("python", py_tps)):
        speed[(config, threads, cpp[0]["attention"], dtype, side)] = statistics.median(tps)
    others = [r for who, rows in sides.items() if who not in ("cpp", "python", "python_compile") for r in rows]
    params = {r["params"] for r in cpp + py + others}
    same = params.pop() if len(params) == 1 else "MISMATCH " + "/".join(sorted(params))
    versions = {r.get("torch", "?") for r in cpp + py + others}
    same += "" if len(versions) == 1 else " TORCH MISMATCH " + "/".join(sorted(versions))
    compiled = sides.get("python_compile", [])
    versus_compile = (f"{statistics.median(cpp_tps) / median_of(compiled, 'tokens_per_s'):7.3f}" if compiled
                      else f"{'-':>7}")
    cpp_ms, py_ms = median_of(cpp, "step_ms"), median_of(py, "step_ms")
    busy = (f"{median_of(cpp, 'busy'):.1f}/{median_of(py, 'busy'):.1f}" if all("busy" in r for r in cpp + py)
            else "-")
    best = (f"{median_of(py, 'best_ms') / median_of(cpp, 'best_ms'):5.3f}" if all("best_ms" in r for r in cpp + py)
            else f"{'-':>5}")
    pair = f"{statistics.median(c / p for c, p in zip(cpp_tps, py_tps)):5.3f}" if len(cpp) == len(py) else f"{'-':>5}"
    gemm = statistics.median(p[0] for p in peak[threads]) if threads in peak else float("nan")
    flops = median_of(cpp, "model_gflops")  # the same model on both sides
    print(f"{config:<10} {threads:>3} {cpp[0]['attention']:<9} {dtype:<5} {spread(cpp_tps):>20} {spread(py_tps):>20} "
          f"{statistics.median(cpp_tps) / statistics.median(py_tps):6.3f} {versus_compile} {cpp_ms:7.0f} {py_ms:7.0f} "
          f"{100 * flops / (cpp_ms / 1000) / gemm:6.1f} {100 * flops / (py_ms / 1000) / gemm:6.1f} "
          f"{median_of(cpp, 'peak_rss_mb'):6.0f} {median_of(py, 'peak_rss_mb'):6.0f} {busy:>9} {best} {pair} {same}")
    if "experts" in py[0]:
        print(f"{'':<10} {'':>3} ^ Py: transformers' experts_implementation {py[0]['experts']}")
    # Further Python sides (the MoE row's eager experts loop) under it: their tokens/s, C++ over them, ms, %pk, MB.
    for who, rows in sides.items():
        if who in ("cpp", "python", "python_compile"):
            continue
        tps = [float(r["tokens_per_s"]) for r in rows]
        ms = median_of(rows, "step_ms")
        side_best = (f"{median_of(rows, 'best_ms') / median_of(cpp, 'best_ms'):5.3f}"
                     if all("best_ms" in r for r in rows + cpp) else f"{'-':>5}")
        side_busy = f"{median_of(rows, 'busy'):.1f}" if all("busy" in r for r in rows) else "-"
        side_pair = (f"{statistics.median(c / o for c, o in zip(cpp_tps, tps)):5.3f}" if len(rows) == len(cpp)
                     else f"{'-':>5}")
        print(f"{'':<10} {'':>3} {who:<15} {'':>20} {spread(tps):>20} "
              f"{statistics.median(cpp_tps) / statistics.median(tps):6.3f} {'':>7} {'':>7} {ms:7.0f} {'':>6} "
              f"{100 * flops / (ms / 1000) / gemm:6.1f} {'':>6} {median_of(rows, 'peak_rss_mb'):6.0f} "
              f"{side_busy:>9} "
              f"{side_best} {side_pair} "
              f"experts_implementation {rows[0].get('experts', '?')}")
scaling = []
for (config, threads, attention, dtype, side), tps in sorted(speed.items()):
    if threads == "2" and (config, "1", attention, dtype, side) in speed:
        scaling.append(f"  {config:<10} {attention:<9} {dtype:<5} {side:<6} 1 -> 2 threads: "
                       f"{tps / speed[(config, '1', attention, dtype, side)]:.2f}x")
    if dtype == "bf16" and (config, threads, attention, "fp32", side) in speed:
        scaling.append(f"  {config:<10} {attention:<9} thr {threads} {side:<6} bf16 / fp32: "
                       f"{tps / speed[(config, threads, attention, 'fp32', side)]:.2f}x")
if scaling:
    print("speed-ups (ratios of median tokens/s)")
    print("\n".join(scaling))
if adamw:
    print("optimizer step on GPT-2 124M parameters, ms: median of the rounds' medians (min-max of the rounds' medians)")
    for (threads, who, impl), rows in sorted(adamw.items()):
        print(f"  threads {threads} {who:<6} {impl:<8} {spread([float(r['step_ms']) for r in rows])}")
PY
