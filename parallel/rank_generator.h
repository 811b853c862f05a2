// Megatron-Core's rank layout: which global ranks form each tensor-, context-, expert-, data- and pipeline-parallel
// group. Pure arithmetic, so every rank's groups can be checked in one process.
//
// The order string names the axes from fastest- to slowest-varying; Megatron's default "tp-cp-ep-dp-pp" gives
//   global_rank = tp_rank + tp * (cp_rank + cp * (ep_rank + ep * (dp_rank + dp * pp_rank))).
// For world 8, tp 2, pp 2: tp groups [[0,1],[2,3],[4,5],[6,7]], dp [[0,2],[1,3],[4,6],[5,7]], pp [[0,4],[1,5],
// [2,6],[3,7]], model-parallel ("tp-pp") [[0,1,4,5],[2,3,6,7]].
#pragma once

#include <string>
#include <vector>

namespace bridge::parallel {

using RankGroups = std::vector<std::vector<int>>;

/// Megatron's generate_masked_orthogonal_rank_groups: the groups whose members differ only along the axes where
/// `mask` is true, for axis sizes `parallel_size` (fastest first). Groups are listed with the other axes' index as
/// the outer loop; within a group ranks ascend along the masked axes.
RankGroups generate_masked_orthogonal_rank_groups(int world_size, const std::vector<int>& parallel_size,
                                                  const std::vector<bool>& mask);

class RankGenerator {
 public:
  /// Throws std::invalid_argument for sizes < 1, ep > 1 together with cp > 1, an axis of size > 1 missing from
  /// `order`, or an unknown or repeated axis name.
  RankGenerator(int tp, int ep, int dp, int pp, int cp, const std::string& order = "tp-cp-ep-dp-pp");

  int world_size() const noexcept { return world_size_; }
  /// The order with every axis present, e.g. "tp-cp-ep-dp-pp".
  const std::string& order() const noexcept { return order_; }

  /// All groups that vary along the axes of `token`: "tp", "dp", "pp", "cp", "ep", or a combination such as "tp-pp"
  /// (model parallel) or "dp-cp". Throws std::invalid_argument naming an unknown axis.
  RankGroups get_ranks(const std::string& token) const;

 private:
  std::vector<std::string> axes_;  // in order
  std::vector<int> sizes_;         // per axis
  std::string order_;
  int world_size_ = 1;
};

/// The embedding group of one pipeline group: its first and last stage (the tied input and output embeddings), or
/// the single rank when there is one stage.
std::vector<int> embedding_ranks(const std::vector<int>& pipeline_ranks);
/// The position-embedding group of one pipeline group: its first stage.
std::vector<int> position_embedding_ranks(const std::vector<int>& pipeline_ranks);

}  // namespace bridge::parallel
