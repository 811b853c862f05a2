// Megatron-Core's fused QKV layout, to and from separate query, key and value projections (Hugging Face's q_proj,
// k_proj and v_proj, or GPT-2's [Q | K | V] columns). linear_qkv's rows are grouped by key/value head: for each of the
// num_query_groups groups, its num_attention_heads / num_query_groups query heads, then its key head, then its value
// head, each head_dim rows. A tensor-parallel rank holds whole groups.
//
//   torch::Tensor qkv = fuse_qkv(q_proj, k_proj, v_proj, config);  // [qkv_size, h] (or [qkv_size] for biases)
//   auto [q, k, v] = split_qkv(qkv, config);                       // back
#pragma once

#include <torch/torch.h>

#include <array>

#include "bridge/models/gpt_config.h"

namespace bridge::models {

/// q: [num_attention_heads * head_dim, ...], k and v: [num_query_groups * head_dim, ...] (heads in order) ->
/// [qkv_size, ...] in Megatron-Core's grouped order. Weights and biases alike (any trailing dimensions).
torch::Tensor fuse_qkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const GPTConfig& config);

/// The inverse of fuse_qkv: {q, k, v}, each contiguous.
std::array<torch::Tensor, 3> split_qkv(const torch::Tensor& qkv, const GPTConfig& config);

}  // namespace bridge::models
