// Rotary position embeddings (Megatron-Core's RotaryEmbedding and apply_rotary_pos_emb): by default the rotate-half
// layout that transformers' Llama, Qwen and Mistral use too (channel i turns with channel i + rotary_dim / 2), or with
// rotary_interleaved the adjacent pairs (0, 1), (2, 3), ... of RoFormer, GPT-J and Meta's original Llama; with Llama
// 3.1's frequency scaling or YaRN's (Megatron-Core's YarnRotaryEmbedding: scaled frequencies, and cos and sin
// multiplied by an attention factor).
//
//   RotaryEmbedding rope(config);                             // the inverse frequencies, once
//   RotaryTables tables = rope.tables(position_ids);          // cos and sin per position, [b, 1, s, rotary_dim]
//   q = apply_rotary_pos_emb(q, tables);                      // q: [b, heads, s, head_dim]
#pragma once

#include <torch/torch.h>

#include "bridge/models/gpt_config.h"

namespace bridge::models {

/// cos and sin of every position's angles, [b, 1, s, rotary_dim] in fp32 (broadcast over heads). Frequency i sits
/// at channels i and i + rotary_dim / 2 ([f0 .. fn, f0 .. fn], Megatron-Core's cat), or, interleaved, at channels 2i
/// and 2i + 1 ([f0 f0 f1 f1 ..], its repeat-interleave): the layout of the channel pairs that turn together.
struct RotaryTables {
  torch::Tensor cos;
  torch::Tensor sin;
  bool interleaved = false;  ///< the pairs are adjacent channels (GPTConfig::rotary_interleaved)
};

class RotaryEmbedding {
 public:
  /// Reads rotary_base, rotary_dim(), rotary_interleaved and the scaling's fields of `config` (rope_scaling*, or
  /// yarn_* with position_embedding_type yarn).
  explicit RotaryEmbedding(const GPTConfig& config);

  /// The tables for `position_ids` ([b, s] int64), on their device, in the config's layout; cos and sin multiplied by
  /// attention_factor().
  RotaryTables tables(const torch::Tensor& position_ids) const;

  /// [rotary_dim / 2] fp32: base^(-2i / rotary_dim), scaled as Llama 3.1 when rope_scaling is on, or as YaRN.
  const torch::Tensor& inv_freq() const { return inv_freq_; }

  /// What cos and sin are multiplied by: YaRN's attention factor (yarn_attention_factor()), else 1.
  double attention_factor() const { return attention_factor_; }

 private:
  torch::Tensor inv_freq_;
  double attention_factor_ = 1.0;
  bool interleaved_ = false;
};

/// YaRN's attention factor ("concentration factor", "mscale") of `config`: yarn_attention_factor when set, else
/// get_mscale(factor, yarn_mscale) / get_mscale(factor, yarn_mscale_all_dim) with get_mscale(s, m) = 0.1 m ln(s) + 1
/// (1 for s <= 1), as Megatron-Core's _yarn_get_concentration_factor.
double yarn_attention_factor(const GPTConfig& config);

/// Rotates the first rotary_dim channels of each head of `t` ([b, heads, s, head_dim]) by the tables' angles:
/// t * cos + rotate_half(t) * sin, where rotate_half([x1, x2]) = [-x2, x1] for the halves x1, x2, or, with
/// tables.interleaved, rotate_half([x0, x1, x2, x3, ..]) = [-x1, x0, -x3, x2, ..] (each pair (x2i, x2i+1) times
/// e^(i angle) as a complex number). The rest pass through. In t's dtype.
torch::Tensor apply_rotary_pos_emb(const torch::Tensor& t, const RotaryTables& tables);

}  // namespace bridge::models
