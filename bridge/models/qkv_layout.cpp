// fuse_qkv and split_qkv: views over [groups, rows of one group, ...].
#include "bridge/models/qkv_layout.h"

#include <stdexcept>
#include <vector>

namespace bridge::models {
namespace {

// [groups, rows, rest...] for a tensor of groups * rows first-dimension entries.
std::vector<int64_t> grouped_shape(const torch::Tensor& tensor, int64_t groups, int64_t rows) {
  std::vector<int64_t> shape = {groups, rows};
  for (int64_t d = 1; d < tensor.dim(); ++d) shape.push_back(tensor.size(d));
  return shape;
}

std::vector<int64_t> flat_shape(const torch::Tensor& tensor, int64_t rows) {
  std::vector<int64_t> shape = {rows};
  for (int64_t d = 2; d < tensor.dim(); ++d) shape.push_back(tensor.size(d));
  return shape;
}

}  // namespace

torch::Tensor fuse_qkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const GPTConfig& config) {
  const int64_t groups = config.query_groups(), d = config.head_dim();
  const int64_t per_group = config.num_attention_heads / groups;
  if (q.size(0) != config.num_attention_heads * d || k.size(0) != groups * d || v.size(0) != groups * d) {
    throw std::invalid_argument("fuse_qkv: q, k and v have " + std::to_string(q.size(0)) + ", " +
                                std::to_string(k.size(0)) + " and " + std::to_string(v.size(0)) +
                                " rows; the model needs " + std::to_string(config.num_attention_heads * d) + ", " +
                                std::to_string(groups * d) + " and " + std::to_string(groups * d));
  }
  const torch::Tensor fused =
      torch::cat({q.reshape(grouped_shape(q, groups, per_group * d)), k.reshape(grouped_shape(k, groups, d)),
                  v.reshape(grouped_shape(v, groups, d))},
                 1);
  return fused.reshape(flat_shape(fused, config.qkv_size()));
}

std::array<torch::Tensor, 3> split_qkv(const torch::Tensor& qkv, const GPTConfig& config) {
  const int64_t groups = config.query_groups(), d = config.head_dim();
  const int64_t per_group = config.num_attention_heads / groups;
  if (qkv.size(0) != config.qkv_size()) {
    throw std::invalid_argument("split_qkv: the fused QKV tensor has " + std::to_string(qkv.size(0)) +
                                " rows; the model's has " + std::to_string(config.qkv_size()));
  }
  const torch::Tensor grouped = qkv.reshape(grouped_shape(qkv, groups, (per_group + 2) * d));
  const auto part = [&](int64_t start, int64_t rows, int64_t total) {
    const torch::Tensor slice = grouped.narrow(1, start, rows).contiguous();
    return slice.reshape(flat_shape(slice, total));
  };
  return {part(0, per_group * d, config.num_attention_heads * d), part(per_group * d, d, groups * d),
          part((per_group + 1) * d, d, groups * d)};
}

}  // namespace bridge::models
