// Statistics of several process groups in one collective. A log step needs the learning rate and grad norm as a
// MAX over the model-parallel group, norms as a SUM over it, memory as a MAX over the pipeline group and the control
// flags as a SUM over the world: one all-reduce each would cost a round trip per statistic (Megatron's loop makes
// about six). Here every rank adds the same entries in the same order, exchange() all-gathers all of them once over
// the world, and each rank reduces every entry over the members of that entry's group itself.
//
//   PackedStatistics stats;
//   auto norm = stats.add("params-norm^2", ReduceOp::kSum, get_model_parallel_group(), {local_norm_squared});
//   auto memory = stats.add("memory", ReduceOp::kMax, get_pipeline_model_parallel_group(), memory_values);
//   stats.exchange(get_world_group());          // the one collective
//   double params_norm = std::sqrt(stats.scalar(norm));
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/process_group.h"

namespace bridge::training::utils {

class PackedStatistics {
 public:
  using Entry = std::size_t;

  /// Adds this rank's `values` for a statistic reduced with `op` over the members of `group` (which must hold this
  /// rank). Every rank of the world must add entries with the same names and lengths in the same order.
  Entry add(std::string_view name, parallel::ReduceOp op, const parallel::ProcessGroup& group,
            std::vector<double> values);

  /// The collective: one all_gather of every entry over `world`, then the local reductions. Throws if the ranks'
  /// entries differ in names or lengths (a different total length already fails in the backend's all_gather). Call
  /// once.
  void exchange(parallel::ProcessGroup& world);

  /// The reduced values of `entry` (after exchange()).
  const std::vector<double>& values(Entry entry) const;
  /// The reduced value of a one-value entry.
  double scalar(Entry entry) const;

  /// Doubles this rank sends (the layout check included).
  std::size_t packed_size() const { return packed_.size() + 1; }

 private:
  struct Item {
    std::string name;
    parallel::ReduceOp op;
    std::vector<int> members;  // the group's global ranks
    std::size_t offset, length;
    std::vector<double> result;
  };
  std::vector<Item> items_;
  std::vector<double> packed_;
  uint32_t layout_hash_ = 2166136261U;  // FNV-1a over names and lengths
  bool exchanged_ = false;
};

}  // namespace bridge::training::utils
