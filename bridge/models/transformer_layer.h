// One pre-norm GPT transformer layer with its heads split across tensor-parallel ranks (Megatron-Core's
// TransformerLayer): x + Dropout(Attention(Norm(x))), then x + Dropout(MLP(Norm(x))). Activations are
// sequence-first, [s, b, h]. Norm is LayerNorm or RMSNorm.
//
// Attention: QKV column-parallel in Megatron-Core's layout, grouped by key/value head: for each query group g, the
// rows of its query heads, then its key head, then its value head ([q..q k v] x groups), so each tensor-parallel rank
// holds whole groups and multi-head attention is the case of one query head per group. Optional per-head q/k norms
// (qk_layernorm), RoPE on queries and keys, grouped-query attention (each key/value head serves its group's query
// heads), a causal softmax on the local heads (LibTorch 2.x: scaled_dot_product_attention) or under the batch's
// attention mask, projection row-parallel. Under context parallelism each rank holds two chunks of the sequence and
// the core attention is parallel/context_parallel/attention.h's over the cp group (model.cp_comm_type).
//
// MLP: the dense MLP (mlp.h), or in the layers moe_layer_freq marks an MoE layer (moe/moe_layer.h) with a norm of its
// own before it, both under the name "mlp" as in Megatron-Core.
#pragma once

#include <torch/torch.h>

#include <string>

#include "bridge/models/gpt_config.h"
#include "bridge/models/mlp.h"
#include "bridge/models/moe/moe_layer.h"
#include "bridge/models/normalization.h"
#include "bridge/models/rotary_pos_embedding.h"
#include "parallel/tensor_parallel/layers.h"

namespace bridge::models {

/// Every weight of the model draws from its own generator, seeded from the config's seed and the weight's global
/// name (e.g. "decoder.layers.3.mlp.linear_fc1.weight"), so layouts agree on every weight.
parallel::tensor_parallel::InitMethod init_method_for(const GPTConfig& config, const std::string& name, double std);

class SelfAttentionImpl : public torch::nn::Module {
 public:
  SelfAttentionImpl(const GPTConfig& config, const std::string& prefix);
  /// `attention_mask`: bool [b, 1, s, s], true where a query may not see a key (Megatron's sense), or undefined for
  /// the causal mask. `rotary`: the RoPE tables of the batch's positions, or null without RoPE.
  torch::Tensor forward(const torch::Tensor& hidden_states, const torch::Tensor& attention_mask = {},
                        const RotaryTables* rotary = nullptr);

  parallel::tensor_parallel::ColumnParallelLinear linear_qkv{nullptr};
  parallel::tensor_parallel::RowParallelLinear linear_proj{nullptr};
  Norm q_layernorm{nullptr};  ///< with qk_layernorm: over each query head's channels (or all heads, across_heads)
  Norm k_layernorm{nullptr};

 private:
  torch::Tensor norm_across_heads(const torch::Tensor& heads, const Norm& norm) const;

  int64_t local_heads_;
  int64_t local_groups_;
  int64_t head_dim_;
  double attention_dropout_;
  AttnBackend attention_backend_;
  bool qk_norm_across_heads_;  // q/k RMSNorm over all heads, the sum of squares all-reduced over tensor parallelism
  double layernorm_epsilon_;
  bool recompute_core_attention_;  // selective recomputation of the core attention
  bool sequence_parallel_;         // the block runs in the tracker's fork
  bool context_parallel_;          // cp > 1: the sequence's chunks are spread over the cp group, attention spans them
  parallel::context_parallel::CpCommType cp_comm_type_;
  torch::Tensor causal_mask_ = torch::empty({0, 0}, torch::kBool);  // [s, s], true above the diagonal; per length
};
TORCH_MODULE(SelfAttention);

class TransformerLayerImpl : public torch::nn::Module {
 public:
  /// `layer_number` is the layer's global index (0-based), which names and seeds its weights.
  TransformerLayerImpl(const GPTConfig& config, int64_t layer_number);
  torch::Tensor forward(const torch::Tensor& hidden_states, const torch::Tensor& attention_mask = {},
                        const RotaryTables* rotary = nullptr);

  int64_t layer_number() const { return layer_number_; }

  Norm input_layernorm{nullptr};
  SelfAttention self_attention{nullptr};
  Norm pre_mlp_layernorm{nullptr};
  MLP mlp{nullptr};                  ///< a dense layer's MLP
  moe::MoELayer moe_layer{nullptr};  ///< an MoE layer's, registered as "mlp"

 private:
  int64_t layer_number_;
  double hidden_dropout_;
  bool recompute_mlp_;  // selective recomputation of the MLP ("mlp", or "moe" for an MoE layer)
};
TORCH_MODULE(TransformerLayer);

}  // namespace bridge::models
