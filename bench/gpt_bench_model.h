// What the pretrain() benchmarks share: the GPT shape flags (--layers --hidden --heads --seq --vocab --micro-batch),
// the model config they describe (no dropout, tied embeddings, clipping) and the median of timings.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cxxopts.hpp>
#include <limits>
#include <vector>

#include "training/config/config.h"

namespace bridge::bench {

/// Adds the model flags with the benchmarks' default shape (4 layers, hidden 256, 4 heads, seq 128, vocab 8192,
/// micro-batch 8).
inline void add_gpt_model_options(cxxopts::Options& options) {
  options.add_options()("layers", "transformer layers", cxxopts::value<int64_t>()->default_value("4"))(
      "hidden", "hidden size", cxxopts::value<int64_t>()->default_value("256"))(
      "heads", "attention heads", cxxopts::value<int64_t>()->default_value("4"))(
      "seq", "sequence length", cxxopts::value<int64_t>()->default_value("128"))(
      "vocab", "vocabulary (padded to a multiple of 128)", cxxopts::value<int64_t>()->default_value("8192"))(
      "micro-batch", "sequences per micro-batch", cxxopts::value<int64_t>()->default_value("8"));
}

/// A config with the flags' model and micro-batch, dropout off (so timings do not depend on masks), clipping on.
inline training::ConfigContainer gpt_bench_config(const cxxopts::ParseResult& args) {
  training::ConfigContainer config;
  config.model.num_layers = args["layers"].as<int64_t>();
  config.model.hidden_size = args["hidden"].as<int64_t>();
  config.model.num_attention_heads = args["heads"].as<int64_t>();
  config.model.seq_length = args["seq"].as<int64_t>();
  config.model.vocab_size = args["vocab"].as<int64_t>();
  config.model.make_vocab_size_divisible_by = 128;
  config.model.hidden_dropout = 0.0;
  config.model.attention_dropout = 0.0;
  config.model.share_embeddings_and_output_weights = true;
  config.train.micro_batch_size = args["micro-batch"].as<int64_t>();
  config.optimizer.clip_grad = 1.0;
  return config;
}

inline double median(std::vector<double> values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace bridge::bench
