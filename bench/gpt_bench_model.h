// What the pretrain() benchmarks share: the GPT shape flags (--layers --hidden --heads --seq --vocab --micro-batch,
// --block gpt|llama|qwen3_moe with --query-groups and --ffn, the MoE block's --experts --topk --moe-ffn --aux-loss),
// the model config they describe (no dropout, clipping; GPT-2's block tied, the Llama and Qwen3-MoE blocks untied)
// and the median of timings.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cxxopts.hpp>
#include <limits>
#include <stdexcept>
#include <string>
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
      "micro-batch", "sequences per micro-batch", cxxopts::value<int64_t>()->default_value("8"))(
      "block",
      "gpt (GPT-2's: LayerNorm, learned positions, GeLU, biases, tied) or llama (RMSNorm, RoPE, SwiGLU, no "
      "biases, untied: transformers' LlamaForCausalLM, bench/llama_train_bench.py) or qwen3_moe (the Llama block "
      "with q/k RMSNorm and every MLP a top-k MoE of SwiGLU experts: transformers' Qwen3MoeForCausalLM, "
      "bench/qwen3_moe_train_bench.py)",
      cxxopts::value<std::string>()->default_value("gpt"))("query-groups", "key/value heads (0: one per query head)",
                                                           cxxopts::value<int64_t>()->default_value("0"))(
      "ffn", "the MLP's hidden size (0: 4 x hidden)", cxxopts::value<int64_t>()->default_value("0"))(
      "experts", "qwen3_moe: routed experts per layer", cxxopts::value<int64_t>()->default_value("8"))(
      "topk", "qwen3_moe: experts per token", cxxopts::value<int64_t>()->default_value("2"))(
      "moe-ffn", "qwen3_moe: one expert's SwiGLU width (0: --ffn)", cxxopts::value<int64_t>()->default_value("0"))(
      "aux-loss", "qwen3_moe: the load-balancing loss's coefficient (0: none)",
      cxxopts::value<double>()->default_value("1e-3"));
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
  config.model.num_query_groups = args["query-groups"].as<int64_t>();
  if (args["ffn"].as<int64_t>() > 0) config.model.ffn_hidden_size = args["ffn"].as<int64_t>();
  const std::string block = args["block"].as<std::string>();
  if (block == "llama" || block == "qwen3_moe") {
    config.model.normalization = models::Normalization::kRMSNorm;
    config.model.position_embedding_type = models::PositionEmbeddingType::kRope;
    config.model.rotary_base = 10000.0;  // transformers' LlamaConfig default
    config.model.gated_linear_unit = true;
    config.model.activation_func = models::ActivationFunc::kSilu;
    config.model.add_bias_linear = false;
    config.model.share_embeddings_and_output_weights = false;
  } else if (block != "gpt") {
    throw std::invalid_argument("--block must be gpt, llama or qwen3_moe, got " + block);
  }
  if (block == "qwen3_moe") {
    // Qwen3-MoE's: q/k RMSNorm, every layer's MLP a MoE (no shared experts), top-k over the logits then the softmax
    // over the k chosen (norm_topk_prob), the Switch load-balancing loss as it trains (router_aux_loss_coef 1e-3).
    config.model.qk_layernorm = true;
    config.model.rotary_base = 1000000.0;  // Qwen3's rope_theta
    config.model.num_moe_experts = args["experts"].as<int64_t>();
    config.model.moe_router_topk = args["topk"].as<int64_t>();
    if (args["moe-ffn"].as<int64_t>() > 0) config.model.moe_ffn_hidden_size = args["moe-ffn"].as<int64_t>();
    config.model.moe_router_pre_softmax = false;
    config.model.moe_aux_loss_coeff = args["aux-loss"].as<double>();
    config.model.moe_router_load_balancing_type = config.model.moe_aux_loss_coeff > 0.0
                                                      ? models::MoELoadBalancingType::kAuxLoss
                                                      : models::MoELoadBalancingType::kNone;
  }
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
