// RankGenerator: Megatron-Core's masked orthogonal rank groups, with validation that names the offending value.
#include "parallel/rank_generator.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "utils/strings.h"

namespace bridge::parallel {
namespace {

std::vector<int> prefix_product(const std::vector<int>& sizes) {
  std::vector<int> result{1};
  for (int size : sizes) result.push_back(result.back() * size);
  return result;
}

// The coordinates of `index` in a grid of `shape`, fastest axis first.
std::vector<int> decompose(int index, const std::vector<int>& shape) {
  std::vector<int> coordinates;
  for (int size : shape) {
    coordinates.push_back(index % size);
    index /= size;
  }
  return coordinates;
}

int inner_product(const std::vector<int>& a, const std::vector<int>& b) {
  int sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, separator);) parts.push_back(part);
  return parts;
}

}  // namespace

RankGroups generate_masked_orthogonal_rank_groups(int world_size, const std::vector<int>& parallel_size,
                                                  const std::vector<bool>& mask) {
  std::vector<int> masked_shape, unmasked_shape, masked_stride, unmasked_stride;
  const std::vector<int> global_stride = prefix_product(parallel_size);
  for (std::size_t axis = 0; axis < parallel_size.size(); ++axis) {
    (mask[axis] ? masked_shape : unmasked_shape).push_back(parallel_size[axis]);
    (mask[axis] ? masked_stride : unmasked_stride).push_back(global_stride[axis]);
  }
  const int group_size = prefix_product(masked_shape).back();
  RankGroups groups;
  for (int group_index = 0; group_index < world_size / group_size; ++group_index) {
    const int base = inner_product(decompose(group_index, unmasked_shape), unmasked_stride);
    std::vector<int> ranks;
    for (int rank_in_group = 0; rank_in_group < group_size; ++rank_in_group) {
      ranks.push_back(base + inner_product(decompose(rank_in_group, masked_shape), masked_stride));
    }
    groups.push_back(std::move(ranks));
  }
  return groups;
}

RankGenerator::RankGenerator(int tp, int ep, int dp, int pp, int cp, const std::string& order) {
  const std::vector<std::pair<std::string, int>> named = {{"tp", tp}, {"pp", pp}, {"dp", dp}, {"ep", ep}, {"cp", cp}};
  for (const auto& [name, size] : named) {
    if (size < 1)
      throw std::invalid_argument("RankGenerator: " + name + " size must be >= 1, got " + std::to_string(size));
  }
  if (ep > 1 && cp > 1) {
    throw std::invalid_argument("RankGenerator: expert (ep=" + std::to_string(ep) + ") and context (cp=" +
                                std::to_string(cp) + ") parallelism cannot both exceed 1 in one generator");
  }
  axes_ = split(order, '-');
  for (const std::string& axis : axes_) {
    const bool known = std::any_of(named.begin(), named.end(), [&](const auto& entry) { return entry.first == axis; });
    if (!known || std::count(axes_.begin(), axes_.end(), axis) != 1) {
      throw std::invalid_argument("RankGenerator: order '" + order + "' has an unknown or repeated axis '" + axis +
                                  "'; use tp, cp, ep, dp and pp once each, e.g. tp-cp-ep-dp-pp");
    }
  }
  for (const auto& [name, size] : named) {
    if (std::find(axes_.begin(), axes_.end(), name) != axes_.end()) continue;
    if (size != 1) {
      throw std::invalid_argument("RankGenerator: " + name + " size is " + std::to_string(size) + " but order '" +
                                  order + "' does not name it");
    }
    axes_.push_back(name);  // a size-1 axis may be left out of the order
  }
  for (const std::string& axis : axes_) {
    const int size = std::find_if(named.begin(), named.end(), [&](const auto& e) { return e.first == axis; })->second;
    sizes_.push_back(size);
    world_size_ *= size;
  }
  order_ = utils::join(axes_, "-");
}

RankGroups RankGenerator::get_ranks(const std::string& token) const {
  std::vector<bool> mask(axes_.size(), false);
  for (const std::string& axis : split(token, '-')) {
    const auto it = std::find(axes_.begin(), axes_.end(), axis);
    if (it == axes_.end()) {
      throw std::invalid_argument("RankGenerator::get_ranks: unknown axis '" + axis + "' in '" + token +
                                  "'; axes are " + order_);
    }
    mask[static_cast<std::size_t>(it - axes_.begin())] = true;
  }
  return generate_masked_orthogonal_rank_groups(world_size_, sizes_, mask);
}

std::vector<int> embedding_ranks(const std::vector<int>& pipeline_ranks) {
  if (pipeline_ranks.size() <= 1) return pipeline_ranks;
  return {pipeline_ranks.front(), pipeline_ranks.back()};
}

std::vector<int> position_embedding_ranks(const std::vector<int>& pipeline_ranks) {
  if (pipeline_ranks.empty()) return {};
  return {pipeline_ranks.front()};
}

}  // namespace bridge::parallel
