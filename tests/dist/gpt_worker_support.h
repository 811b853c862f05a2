// What the GPT workers of the multi-process tests share: a tiny GPT whose padded vocabulary is the same in every
// layout (so every layout trains the same model), a check that records a failure and lets the rank go on (a rank
// that stopped early would leave the others waiting), and the frame of their main().
#pragma once

#include <cstdio>
#include <exception>
#include <string>

#include "parallel/distributed.h"
#include "training/config/config.h"

namespace bridge::testing {

inline int& worker_failures() {
  static int failures = 0;
  return failures;
}

/// Prints "rank r: FAILED <what>" and counts it when `condition` is false.
inline void expect(bool condition, const std::string& what) {
  if (condition) return;
  ++worker_failures();
  std::printf("rank %d: FAILED %s\n", parallel::get_rank(), what.c_str());
  std::fflush(stdout);
}

/// 4 layers, hidden 32, 4 heads, vocab 128 (padded to 128 at tp 1 and 2), seq 16, no dropout, micro-batch 1,
/// global batch 4, AdamW with clipping, one thread.
inline training::ConfigContainer tiny_gpt_config(int tp, int pp, int vpp, int64_t steps) {
  training::ConfigContainer config;
  config.model.num_layers = 4;
  config.model.hidden_size = 32;
  config.model.num_attention_heads = 4;
  config.model.vocab_size = 128;
  config.model.make_vocab_size_divisible_by = 64;
  config.model.seq_length = 16;
  config.model.hidden_dropout = 0.0;
  config.model.attention_dropout = 0.0;
  config.model.init_seed = 7;
  config.train.micro_batch_size = 1;
  config.train.global_batch_size = 4;
  config.train.train_iters = steps;
  config.train.num_threads = 1;
  config.optimizer.lr = 1e-3;
  config.optimizer.clip_grad = 1.0;
  config.ddp.bucket_size = 4000;  // several buckets
  config.parallelism.tensor_model_parallel_size = tp;
  config.parallelism.pipeline_model_parallel_size = pp;
  if (vpp > 0) config.parallelism.virtual_pipeline_model_parallel_size = vpp;
  return config;
}

/// The tiny model with the Llama family's block and Qwen3's q/k norms: RMSNorm, RoPE, SwiGLU, 2 key/value groups
/// (one per rank at tp2), no biases, an untied output layer.
inline void use_llama_block(models::GPTConfig& model) {
  model.normalization = models::Normalization::kRMSNorm;
  model.position_embedding_type = models::PositionEmbeddingType::kRope;
  model.gated_linear_unit = true;
  model.activation_func = models::ActivationFunc::kSilu;
  model.num_query_groups = 2;
  model.add_bias_linear = false;
  model.qk_layernorm = true;
  model.share_embeddings_and_output_weights = false;
}

/// The Llama block with Qwen3-MoE's MLPs: 4 experts of width 24, top 2 (softmax over the 2), a load-balancing loss
/// and a z-loss (both in the gradient), the second layer dense (moe_layer_freq [1, 0, 1, 1]). Router weights drawn
/// wide (std 0.5 for the whole model) so no near-tie flips a token's experts between layouts.
inline void use_moe_block(models::GPTConfig& model) {
  use_llama_block(model);
  model.num_moe_experts = 4;
  model.moe_ffn_hidden_size = 24;
  model.moe_router_topk = 2;
  model.moe_layer_freq.pattern = {1, 0, 1, 1};
  model.moe_aux_loss_coeff = 1e-2;
  model.moe_z_loss_coeff = 1e-3;
  model.moe_shared_expert_intermediate_size = 16;
  model.moe_shared_expert_gate = true;
}

/// main() of a worker: initialises the world (which outlives pretrain(), so each run creates and releases only its
/// model-parallel groups), runs `dispatch(scenario)` — an exit code, or -1 for arguments it does not know (then
/// `usage` goes to stderr and the exit code is 2) — and prints "<scenario>: ok" when it returned 0 and no expect()
/// failed. An exception prints "FAILED with exception: ..." and exits 1.
template <class Dispatch>
int worker_main(int argc, char** argv, const char* usage, Dispatch&& dispatch) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  int code = 2;
  try {
    parallel::init_distributed();
    code = dispatch(scenario);
    if (code == -1) {
      parallel::destroy_distributed();
      std::fputs(usage, stderr);
      return 2;
    }
  } catch (const std::exception& error) {
    std::printf("FAILED with exception: %s\n", error.what());
    std::fflush(stdout);
    return 1;
  }
  parallel::destroy_distributed();
  if (code == 0 && worker_failures() == 0) std::printf("%s: ok\n", scenario.c_str());
  return worker_failures() > 0 ? 1 : code;
}

}  // namespace bridge::testing
