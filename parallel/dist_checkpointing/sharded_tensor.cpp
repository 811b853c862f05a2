// Sharded-tensor layouts: computing them from the tensor-parallel attributes, and copying between two layouts of
// the same global tensor through global coordinates. An MoE expert's weight is split over the expert tensor-parallel
// group; which expert it is (expert parallelism) is in its global name, not in its layout.
#include "parallel/dist_checkpointing/sharded_tensor.h"

#include <algorithm>
#include <stdexcept>

#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"

namespace bridge::parallel::dist_checkpointing {
namespace {

using Block = ShardedTensorLayout::Block;

// The dimension both layouts are compared along: the sharded one's, or 0 when both are whole tensors.
int64_t common_dim(const ShardedTensorLayout& a, const ShardedTensorLayout& b) {
  if (!a.replicated() && !b.replicated() && a.partition_dim != b.partition_dim) {
    throw std::runtime_error("a tensor saved split on dim " + std::to_string(b.partition_dim) +
                             " cannot load into one split on dim " + std::to_string(a.partition_dim));
  }
  return !a.replicated() ? a.partition_dim : !b.replicated() ? b.partition_dim : 0;
}

// A whole tensor as one block along `dim`.
std::vector<Block> blocks_along(const ShardedTensorLayout& layout, int64_t dim) {
  if (!layout.replicated()) return layout.blocks;
  const auto extent = layout.global_shape.at(static_cast<std::size_t>(dim));
  return {Block{0, 0, extent}};
}

int64_t overlap(int64_t begin_a, int64_t end_a, int64_t begin_b, int64_t end_b) {
  return std::max<int64_t>(0, std::min(end_a, end_b) - std::max(begin_a, begin_b));
}

}  // namespace

std::string ShardedTensorLayout::describe() const {
  std::string shape = "[";
  for (std::size_t i = 0; i < global_shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(global_shape[i]);
  shape += "]";
  if (replicated()) return shape + " whole";
  return shape + " split on dim " + std::to_string(partition_dim) + " in " + std::to_string(blocks.size()) +
         " block(s)";
}

ShardedTensorLayout sharded_tensor_layout(const torch::Tensor& param) {
  const tensor_parallel::ParamAttributes attributes = tensor_parallel::get_param_attributes(param);
  ShardedTensorLayout layout;
  layout.global_shape = param.sizes().vec();
  if (!attributes.tensor_model_parallel || attributes.partition_dim < 0) return layout;
  const int64_t dim = attributes.partition_dim;
  // An expert-parallel parameter (allreduce false) is split over the expert tensor-parallel group, which may be
  // smaller or larger than the dense one (expert_tensor_parallel_size); an expert that keeps allreduce is split over
  // the dense group, which is then the same ranks.
  const bool expert = !attributes.allreduce;
  const int64_t tp = expert ? get_expert_tensor_parallel_world_size() : get_tensor_model_parallel_world_size();
  const int64_t rank = expert ? get_expert_tensor_parallel_rank() : get_tensor_model_parallel_rank();
  const int64_t stride = attributes.partition_stride;
  const int64_t local = param.size(dim);
  if (local % stride != 0) {
    throw std::logic_error("sharded_tensor_layout: dim " + std::to_string(dim) + " of length " + std::to_string(local) +
                           " does not split into stride " + std::to_string(stride));
  }
  layout.partition_dim = dim;
  layout.global_shape[static_cast<std::size_t>(dim)] = local * tp;
  const int64_t chunk = local / stride;
  for (int64_t j = 0; j < stride; ++j) layout.blocks.push_back(Block{j * chunk, (j * tp + rank) * chunk, chunk});
  return layout;
}

namespace {

// Calls copy(target_local_start, source_local_start, n, dim) for every run the two layouts share; returns the sum of n.
template <class Copy>
int64_t for_each_overlap(const ShardedTensorLayout& target_layout, const ShardedTensorLayout& source_layout,
                         Copy&& copy) {
  const int64_t dim = common_dim(target_layout, source_layout);
  int64_t written = 0;
  for (const Block& t : blocks_along(target_layout, dim)) {
    for (const Block& s : blocks_along(source_layout, dim)) {
      const int64_t begin = std::max(t.global_start, s.global_start);
      const int64_t n = overlap(t.global_start, t.global_start + t.length, s.global_start, s.global_start + s.length);
      if (n == 0) continue;
      copy(dim, t.local_start + begin - t.global_start, s.local_start + begin - s.global_start, n);
      written += n;
    }
  }
  return written;
}

}  // namespace

int64_t copy_overlap(torch::Tensor& target, const ShardedTensorLayout& target_layout, const torch::Tensor& source,
                     const ShardedTensorLayout& source_layout) {
  torch::NoGradGuard no_grad;
  return for_each_overlap(target_layout, source_layout,
                          [&](int64_t dim, int64_t target_start, int64_t source_start, int64_t n) {
                            target.narrow(dim, target_start, n).copy_(source.narrow(dim, source_start, n));
                          });
}

int64_t count_overlap(const ShardedTensorLayout& target_layout, const ShardedTensorLayout& source_layout) {
  return for_each_overlap(target_layout, source_layout, [](int64_t, int64_t, int64_t, int64_t) {});
}

int64_t positions_needed(const ShardedTensorLayout& target_layout, const ShardedTensorLayout& source_layout) {
  const int64_t dim = common_dim(target_layout, source_layout);
  const int64_t source_extent = source_layout.global_shape.at(static_cast<std::size_t>(dim));
  int64_t needed = 0;
  for (const Block& t : blocks_along(target_layout, dim)) {
    needed += overlap(t.global_start, t.global_start + t.length, 0, source_extent);
  }
  return needed;
}

c10::IValue to_ivalue(const ShardedTensorLayout& layout) {
  c10::impl::GenericList shape(c10::AnyType::get());
  for (int64_t size : layout.global_shape) shape.push_back(size);
  c10::impl::GenericList blocks(c10::AnyType::get());
  for (const Block& block : layout.blocks) {
    c10::impl::GenericList entry(c10::AnyType::get());
    entry.push_back(block.local_start);
    entry.push_back(block.global_start);
    entry.push_back(block.length);
    blocks.push_back(entry);
  }
  c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
  dict.insert("global_shape", shape);
  dict.insert("partition_dim", layout.partition_dim);
  dict.insert("blocks", blocks);
  return dict;
}

ShardedTensorLayout layout_from_ivalue(const c10::IValue& value, const std::string& what) {
  auto malformed = [&](const std::string& detail) {
    return std::runtime_error("the shard metadata of " + what + " is malformed (" + detail +
                              "); the checkpoint is damaged or was not written by bridge");
  };
  if (!value.isGenericDict()) throw malformed("not a dict");
  const c10::impl::GenericDict dict = value.toGenericDict();
  auto field = [&](const char* key) {
    auto it = dict.find(c10::IValue(std::string(key)));
    if (it == dict.end()) throw malformed(std::string("no '") + key + "'");
    return it->value();
  };
  auto ints = [&](const c10::IValue& list, const std::string& name) {
    if (!list.isList()) throw malformed(name + " is not a list");
    std::vector<int64_t> result;
    for (const c10::IValue& item : list.toListRef()) {
      if (!item.isInt()) throw malformed(name + " holds a non-integer");
      result.push_back(item.toInt());
    }
    return result;
  };
  ShardedTensorLayout layout;
  layout.global_shape = ints(field("global_shape"), "global_shape");
  const c10::IValue dim = field("partition_dim");
  if (!dim.isInt()) throw malformed("partition_dim is not an integer");
  layout.partition_dim = dim.toInt();
  const c10::IValue blocks = field("blocks");
  if (!blocks.isList()) throw malformed("blocks is not a list");
  for (const c10::IValue& block : blocks.toListRef()) {
    const std::vector<int64_t> numbers = ints(block, "a block");
    if (numbers.size() != 3) throw malformed("a block has " + std::to_string(numbers.size()) + " numbers, not 3");
    layout.blocks.push_back(Block{numbers[0], numbers[1], numbers[2]});
  }
  if (layout.partition_dim >= static_cast<int64_t>(layout.global_shape.size())) throw malformed("partition_dim");
  return layout;
}

}  // namespace bridge::parallel::dist_checkpointing
