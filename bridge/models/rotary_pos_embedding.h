// Rotary position embeddings (Megatron-Core's RotaryEmbedding and apply_rotary_pos_emb, non-interleaved: the
// rotate-half layout that transformers' Llama, Qwen and Mistral use too), with Llama 3.1's frequency scaling.
//
//   RotaryEmbedding rope(config);                             // the inverse frequencies, once
//   RotaryTables tables = rope.tables(position_ids);          // cos and sin per position, [b, 1, s, rotary_dim]
//   q = apply_rotary_pos_emb(q, tables);                      // q: [b, heads, s, head_dim]
#pragma once

#include <torch/torch.h>

#include "bridge/models/gpt_config.h"

namespace bridge::models {

/// cos and sin of every position's angles, [b, 1, s, rotary_dim] in fp32 (broadcast over heads).
struct RotaryTables {
  torch::Tensor cos;
  torch::Tensor sin;
};

class RotaryEmbedding {
 public:
  /// Reads rotary_base, rotary_dim() and the rope_scaling fields of `config`.
  explicit RotaryEmbedding(const GPTConfig& config);

  /// The tables for `position_ids` ([b, s] int64), on their device.
  RotaryTables tables(const torch::Tensor& position_ids) const;

  /// [rotary_dim / 2] fp32: base^(-2i / rotary_dim), scaled as Llama 3.1 when rope_scaling is on.
  const torch::Tensor& inv_freq() const { return inv_freq_; }

 private:
  torch::Tensor inv_freq_;
};

/// Rotates the first rotary_dim channels of each head of `t` ([b, heads, s, head_dim]) by the tables' angles:
/// t * cos + rotate_half(t) * sin, where rotate_half([x1, x2]) = [-x2, x1]. The rest pass through. In t's dtype.
torch::Tensor apply_rotary_pos_emb(const torch::Tensor& t, const RotaryTables& tables);

}  // namespace bridge::models
