// One pre-norm GPT transformer layer with its heads split across tensor-parallel ranks (Megatron-Core's
// TransformerLayer): x + Dropout(Attention(LN(x))), then x + Dropout(MLP(LN(x))). Activations are sequence-first,
// [s, b, h]. Attention: QKV column-parallel (each rank holds whole heads), causal softmax on the local heads (LibTorch
// 2.x: scaled_dot_product_attention) or under the batch's attention mask, projection row-parallel. MLP: fc1
// column-parallel, GeLU (exact or tanh), fc2 row-parallel.
#pragma once

#include <torch/torch.h>

#include <string>

#include "bridge/models/gpt_config.h"
#include "parallel/tensor_parallel/layers.h"

namespace bridge::models {

/// Every weight of the model draws from its own generator, seeded from the config's seed and the weight's global
/// name (e.g. "decoder.layers.3.mlp.linear_fc1.weight"), so layouts agree on every weight.
parallel::tensor_parallel::InitMethod init_method_for(const GPTConfig& config, const std::string& name, double std);

class SelfAttentionImpl : public torch::nn::Module {
 public:
  SelfAttentionImpl(const GPTConfig& config, const std::string& prefix);
  /// `attention_mask`: bool [b, 1, s, s], true where a query may not see a key (Megatron's sense), or undefined for
  /// the causal mask.
  torch::Tensor forward(const torch::Tensor& hidden_states, const torch::Tensor& attention_mask = {});

  parallel::tensor_parallel::ColumnParallelLinear linear_qkv{nullptr};
  parallel::tensor_parallel::RowParallelLinear linear_proj{nullptr};

 private:
  int64_t local_heads_;
  int64_t head_dim_;
  double attention_dropout_;
  AttnBackend attention_backend_;
  torch::Tensor causal_mask_ = torch::empty({0, 0}, torch::kBool);  // [s, s], true above the diagonal; per length
};
TORCH_MODULE(SelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const GPTConfig& config, const std::string& prefix);
  torch::Tensor forward(const torch::Tensor& hidden_states);

  parallel::tensor_parallel::ColumnParallelLinear linear_fc1{nullptr};
  parallel::tensor_parallel::RowParallelLinear linear_fc2{nullptr};

 private:
  ActivationFunc activation_func_;
};
TORCH_MODULE(MLP);

class TransformerLayerImpl : public torch::nn::Module {
 public:
  /// `layer_number` is the layer's global index (0-based), which names and seeds its weights.
  TransformerLayerImpl(const GPTConfig& config, int64_t layer_number);
  torch::Tensor forward(const torch::Tensor& hidden_states, const torch::Tensor& attention_mask = {});

  int64_t layer_number() const { return layer_number_; }

  torch::nn::LayerNorm input_layernorm{nullptr};
  SelfAttention self_attention{nullptr};
  torch::nn::LayerNorm pre_mlp_layernorm{nullptr};
  MLP mlp{nullptr};

 private:
  int64_t layer_number_;
  double hidden_dropout_;
};
TORCH_MODULE(TransformerLayer);

}  // namespace bridge::models
