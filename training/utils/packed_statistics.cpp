// PackedStatistics: one all_gather over the world, then per-entry reductions over each entry's group, done locally.
#include "training/utils/packed_statistics.h"

#include <algorithm>
#include <stdexcept>

namespace bridge::training::utils {
namespace {

uint32_t fnv1a(uint32_t hash, std::string_view bytes) {
  for (const char c : bytes) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 16777619U;
  }
  return hash;
}

}  // namespace

PackedStatistics::Entry PackedStatistics::add(std::string_view name, parallel::ReduceOp op,
                                              const parallel::ProcessGroup& group, std::vector<double> values) {
  if (exchanged_) throw std::logic_error("PackedStatistics::add('" + std::string(name) + "') after exchange()");
  Item item{std::string(name), op, group.global_ranks(), packed_.size(), values.size(), {}};
  packed_.insert(packed_.end(), values.begin(), values.end());
  layout_hash_ = fnv1a(layout_hash_, item.name + "#" + std::to_string(item.length) + ";");
  items_.push_back(std::move(item));
  return items_.size() - 1;
}

void PackedStatistics::exchange(parallel::ProcessGroup& world) {
  if (exchanged_) throw std::logic_error("PackedStatistics::exchange() called twice");
  exchanged_ = true;
  // The layout hash travels first; a 32-bit integer is exact in a double.
  std::vector<double> send(packed_.size() + 1);
  send[0] = static_cast<double>(layout_hash_);
  std::copy(packed_.begin(), packed_.end(), send.begin() + 1);
  const torch::Tensor mine = torch::from_blob(send.data(), {static_cast<int64_t>(send.size())}, torch::kDouble);
  const std::vector<torch::Tensor> gathered = world.all_gather(mine);

  std::vector<const double*> by_global_rank(
      static_cast<std::size_t>(*std::max_element(world.global_ranks().begin(), world.global_ranks().end())) + 1);
  for (std::size_t i = 0; i < gathered.size(); ++i) {
    const double* data = gathered[i].data_ptr<double>();
    if (data[0] != send[0]) {
      throw std::runtime_error("PackedStatistics: rank " + std::to_string(world.global_ranks()[i]) +
                               " packed different statistics than rank " +
                               std::to_string(world.global_ranks()[static_cast<std::size_t>(world.rank())]) +
                               " (names or lengths differ); every rank must add the same entries in the same order");
    }
    by_global_rank[static_cast<std::size_t>(world.global_ranks()[i])] = data + 1;
  }
  for (Item& item : items_) {
    item.result.assign(item.length, 0.0);
    bool first = true;
    for (const int member : item.members) {
      const double* values = by_global_rank.at(static_cast<std::size_t>(member)) + item.offset;
      for (std::size_t k = 0; k < item.length; ++k) {
        double& out = item.result[k];
        switch (item.op) {
          case parallel::ReduceOp::kSum:
            out += values[k];
            break;
          case parallel::ReduceOp::kMax:
            out = first ? values[k] : std::max(out, values[k]);
            break;
          case parallel::ReduceOp::kMin:
            out = first ? values[k] : std::min(out, values[k]);
            break;
        }
      }
      first = false;
    }
  }
}

const std::vector<double>& PackedStatistics::values(Entry entry) const {
  if (!exchanged_) throw std::logic_error("PackedStatistics::values() before exchange()");
  return items_.at(entry).result;
}

double PackedStatistics::scalar(Entry entry) const {
  const std::vector<double>& result = values(entry);
  if (result.size() != 1) {
    throw std::logic_error("PackedStatistics::scalar(): '" + items_.at(entry).name + "' has " +
                           std::to_string(result.size()) + " values");
  }
  return result[0];
}

}  // namespace bridge::training::utils
