#!/usr/bin/env bash
# Tokenizing speed: bridge-preprocess-data end to end (JSON lines in, .bin/.idx out) against the Python libraries'
# own batch encoders on the same texts already in memory (tokenizers' encode_batch, tiktoken's
# encode_ordinary_batch, sentencepiece's encode), at 1 and 2 threads, on one corpus and one tokenizer per row:
#   gpt2-bpe   bridge's GPT2BPETokenizer (vocab.json + merges.txt) | tokenizers, tiktoken on the same 16k BPE
#   hf-bpe     bridge's HuggingFaceTokenizer on that BPE's tokenizer.json | the same
#   sp-bpe     bridge's SentencePieceTokenizer (libsentencepiece) | the sentencepiece package, a 16k BPE model
#   sp-llama2  bridge's Llama2Tokenizer | the same, a 16k BPE with Llama-2's settings (whitespace runs kept)
# bench/tokenizer_bench.py makes the corpus (English from /usr/share/doc, 20 MB by default) and trains the tokenizers
# with the real libraries. Each row prints MB/s of text (median of --rounds, min-max), and whether every id of each
# side equals the library's (the sha256 of the ids as .bin holds them), then bridge's 2-thread speed over its 1-thread
# one (each round runs both back to back: the median of the rounds' ratios, min-max) with the CPU seconds of each (all
# threads). Builds nothing: build bridge-preprocess-data.
#
# Usage: bench/run_tokenizer_bench.sh [--build DIR] [--megabytes N] [--rounds N] [--work DIR] [--rows "gpt2-bpe ..."]
set -euo pipefail
build=build
megabytes=20
rounds=3
work=/tmp/bridge_tokenizer_bench
rows="gpt2-bpe hf-bpe sp-bpe sp-llama2"
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --megabytes) megabytes=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
python=.venv/bin/python
preprocess="$build/tools/bridge-preprocess-data"
[[ -x "$preprocess" ]] || { echo "no $preprocess: cmake --build $build --target bridge-preprocess-data" >&2; exit 1; }
mkdir -p "$work"
corpus="$work/corpus_${megabytes}mb.jsonl"
[[ -s "$corpus" ]] || "$python" bench/tokenizer_bench.py corpus "$corpus" "$megabytes"
[[ -s "$work/sp/tokenizer.model" && -s "$work/sp_llama2/tokenizer.model" ]] ||
  "$python" bench/tokenizer_bench.py train "$corpus" "$work"
bytes=$("$python" -c "import json,sys; print(sum(len(json.loads(l)['text'].encode()) for l in open(sys.argv[1])))" "$corpus")
echo "corpus: $corpus, $bytes bytes of text; CPU: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores"

# bridge: one end-to-end run; prints "mb_per_s cpu_seconds sha256" (CPU: user + system, every thread's).
bridge_run() {  # type threads flags...
  local type=$1 threads=$2 real user system TIMEFORMAT
  shift 2
  TIMEFORMAT='%3R %3U %3S'
  if ! { time "$preprocess" --input "$corpus" --output-prefix "$work/out" --append-eod --workers "$threads" \
      --log-interval 0 --tokenizer-type "$type" "$@" >/dev/null; } 2>"$work/time.txt"; then
    cat "$work/time.txt" >&2
    return 1
  fi
  read -r real user system < <(tail -1 "$work/time.txt")
  echo "$(awk -v b="$bytes" -v s="$real" 'BEGIN { printf "%.2f", b / s / 1e6 }')" \
    "$(awk -v u="$user" -v s="$system" 'BEGIN { printf "%.3f", u + s }')" \
    "$(sha256sum "$work/out_text_document.bin" | cut -d' ' -f1)"
}
library_run() {  # library threads
  RAYON_NUM_THREADS=$2 TOKENIZERS_PARALLELISM=true "$python" bench/tokenizer_bench.py time "$corpus" "$work" "$1" "$2" |
    sed -n 's/.*mb_per_s=\([0-9.]*\).*sha256=\([0-9a-f]*\).*/\1 \2/p'
}
summary() {  # values...: "median (min-max)"
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { printf "%.2f (%.2f-%.2f)", v[int((NR + 1) / 2)], v[1], v[NR] }'
}

printf "%-9s %-8s %-22s %-22s %-22s %s\n" row threads bridge tokenizers/sentencepiece tiktoken "ids equal"
for row in $rows; do
  case $row in
    gpt2-bpe) flags=(GPT2BPETokenizer --vocab-file "$work/bpe/vocab.json" --merge-file "$work/bpe/merges.txt")
              libraries=(tokenizers tiktoken) ;;
    hf-bpe) flags=(HuggingFaceTokenizer --tokenizer-model "$work/bpe"); libraries=(tokenizers tiktoken) ;;
    sp-bpe) flags=(SentencePieceTokenizer --tokenizer-model "$work/sp/tokenizer.model"); libraries=(sentencepiece) ;;
    sp-llama2) flags=(Llama2Tokenizer --tokenizer-model "$work/sp_llama2/tokenizer.model")
               libraries=(sentencepiece-llama2) ;;
    *) echo "unknown row $row (gpt2-bpe hf-bpe sp-bpe sp-llama2)" >&2; exit 2 ;;
  esac
  # Each round runs bridge at 1 and 2 threads back to back, then each library at 1 and 2, so that the machine's
  # drift (shared cores) falls on both of a pair alike, and each pair follows the same kind of run.
  declare -A speeds=() cpus=() digests=()
  for ((r = 0; r < rounds; r++)); do
    for threads in 1 2; do
      read -r speed cpu digest < <(bridge_run "${flags[0]}" "$threads" "${flags[@]:1}")
      speeds[bridge$threads]+="$speed "; cpus[bridge$threads]+="$cpu "; digests[bridge$threads]=$digest
    done
    for threads in 1 2; do
      for library in "${libraries[@]}"; do
        read -r speed digest < <(library_run "$library" "$threads")
        speeds[$library$threads]+="$speed "; digests[$library$threads]=$digest
      done
    done
  done
  for threads in 1 2; do
    equal=yes
    for library in "${libraries[@]}"; do
      [[ ${digests[$library$threads]} == "${digests[bridge$threads]}" ]] || equal="NO ($library)"
    done
    # shellcheck disable=SC2086
    printf "%-9s %-8s %-22s %-22s %-22s %s\n" "$row" "$threads" "$(summary ${speeds[bridge$threads]})" \
      "$(summary ${speeds[${libraries[0]}$threads]})" \
      "$( [[ ${#libraries[@]} -gt 1 ]] && summary ${speeds[tiktoken$threads]} || echo -)" "$equal"
  done
  # The ratio of each round's two runs (back to back, so a busy host weighs on both alike), median and min-max; the
  # CPU seconds tell the work that a second thread adds from what a busy host takes away.
  ratios=()
  read -ra one <<<"${speeds[bridge1]}"
  read -ra two <<<"${speeds[bridge2]}"
  for ((r = 0; r < rounds; r++)); do ratios+=("$(awk -v a="${two[r]}" -v b="${one[r]}" 'BEGIN { print a / b }')"); done
  read -r ratio spread <<<"$(summary "${ratios[@]}")"
  # shellcheck disable=SC2086
  printf "%-9s 2 vs 1   bridge %sx %s (CPU seconds %s at 1 thread, %s at 2)\n" "$row" "$ratio" "$spread" \
    "$(summary ${cpus[bridge1]})" "$(summary ${cpus[bridge2]})"
  unset speeds cpus digests
done
