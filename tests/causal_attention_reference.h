// Test support: causal attention of a whole sequence by its definition, in fp64, the reference the
// context-parallel attention (parallel/context_parallel/attention.h) is checked against in one process and over
// real ranks.
#pragma once

#include <torch/torch.h>

#include <limits>

namespace bridge::testing {

/// softmax(q k^T scale, keys after the query hidden) v in fp64. q: [b, heads, s, d]; k, v: [b, groups, s, d], query
/// head i reading key/value head i / (heads / groups). Differentiable in q, k and v.
inline torch::Tensor reference_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                                double scale) {
  const int64_t per_group = q.size(1) / k.size(1), s = q.size(2);
  const torch::Tensor keys = k.to(torch::kFloat64).repeat_interleave(per_group, 1);
  const torch::Tensor values = v.to(torch::kFloat64).repeat_interleave(per_group, 1);
  const torch::Tensor hidden = torch::ones({s, s}, torch::kBool).triu(1);
  const torch::Tensor scores = torch::matmul(q.to(torch::kFloat64), keys.transpose(-2, -1)) * scale;
  return torch::matmul(scores.masked_fill(hidden, -std::numeric_limits<double>::infinity()).softmax(-1), values);
}

}  // namespace bridge::testing
