// GPTConfig: the shape of a GPT model (Megatron-Core's TransformerConfig, reduced to what a GPT needs) and how it is
// laid out over tensor- and pipeline-parallel ranks. validate() names the field and the fix for every bad value.
//
//   GPTConfig config;
//   config.num_layers = 12; config.hidden_size = 768; config.num_attention_heads = 12;
//   config.vocab_size = 50257; config.seq_length = 1024;
//   config.validate(/*tp=*/2, /*pp=*/2, /*vpp=*/std::nullopt);
#pragma once

#include <cstdint>
#include <optional>

namespace bridge::models {

/// How attention is computed (Megatron-Core's AttnBackend, reduced to what LibTorch offers).
enum class AttnBackend {
  /// scaled_dot_product_attention on LibTorch 2.x (flash/memory-efficient kernels where they apply), the explicit
  /// softmax on 1.x.
  kAuto,
  /// Always the explicit matmul-softmax-matmul: the reference kAuto is checked and timed against.
  kUnfused,
};

/// The MLP's activation (Megatron-Core's activation_func, of the two GPTs use).
enum class ActivationFunc {
  /// GeLU with the exact erf (torch.nn.functional.gelu; Megatron's default).
  kGelu,
  /// GeLU's tanh approximation: OpenAI's GPT-2 (Hugging Face's `gelu_new`), Megatron's --openai-gelu.
  kOpenaiGelu,
};

struct GPTConfig {
  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t num_attention_heads = 4;
  /// MLP width; 0 means 4 * hidden_size.
  int64_t ffn_hidden_size = 0;
  /// Tokenizer vocabulary; the embedding is padded to a multiple of make_vocab_size_divisible_by * tp.
  int64_t vocab_size = 256;
  int64_t make_vocab_size_divisible_by = 128;
  /// Longest sequence the position embedding covers.
  int64_t seq_length = 64;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  AttnBackend attention_backend = AttnBackend::kAuto;
  ActivationFunc activation_func = ActivationFunc::kGelu;
  double layernorm_epsilon = 1e-5;
  /// Standard deviation of the normal initialisation; output projections use std / sqrt(2 * num_layers).
  double init_method_std = 0.02;
  /// Seed of the weight initialisation. Every weight is drawn from its own generator seeded from this and the
  /// weight's name, so any tp/pp/vpp layout starts from the same model.
  uint64_t init_seed = 1234;
  /// Tie the output layer to the word embedding (GPT-2). With pp > 1 the last stage holds a copy whose gradient is
  /// summed with the first stage's over the embedding group.
  bool share_embeddings_and_output_weights = true;
  /// Megatron's gradient_accumulation_fusion: each linear layer's weight-gradient GEMM, and the word embedding's
  /// backward, add straight into the weight's main_grad in the DistributedDataParallel grad buffer (no temporary
  /// gradient, no extra pass). Off for code that takes weight gradients with torch::autograd::grad().
  bool gradient_accumulation_fusion = true;

  int64_t ffn_size() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  /// Throws std::invalid_argument naming the field ("model.num_attention_heads") for sizes that do not fit the layout.
  void validate(int tensor_model_parallel_size = 1, int pipeline_model_parallel_size = 1,
                std::optional<int> virtual_pipeline_model_parallel_size = std::nullopt) const;
};

}  // namespace bridge::models
