// The parallel layout as one rank sees it: the global ranks of every group it belongs to, computed from the world
// size and Megatron's initialize_model_parallel arguments. Pure, so tests check every rank of a job in one process.
//
// As in Megatron-Core, two rank generators share the world: the dense one (tp x cp x dp x pp) for attention and
// every non-expert layer, and the expert one (etp x ep x edp x pp, no context axis) for MoE experts. Per stage
// etp x ep x edp = tp x cp x dp: expert parallelism takes its ranks from the dense data- and context- (and, with
// etp < tp, tensor-) parallel ranks instead of adding GPUs. Both give the same pipeline groups, so a rank is on one
// stage in either view.
//
// Context parallelism splits each sequence over the cp ranks of one data-parallel replica: they hold the same weights
// and optimizer state but different tokens, so whatever is reduced or elected over the data-parallel replicas
// (gradients, optimizer shards, checkpoint writers, token and loss totals) spans dp x cp ("dp-cp").
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace bridge::parallel {

/// Megatron-Core's initialize_model_parallel arguments.
struct ParallelOptions {
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  /// Model chunks per pipeline rank (interleaved 1F1B); needs pipeline_model_parallel_size > 1.
  std::optional<int> virtual_pipeline_model_parallel_size;
  /// Ranks each sequence is split over (Megatron's --context-parallel-size). They are taken next to the tensor-parallel
  /// ranks in the default order; dp = world / (tp x cp x pp).
  int context_parallel_size = 1;
  /// Ranks the experts of an MoE layer are split over (Megatron's --expert-model-parallel-size); taken out of the
  /// data- (or, with a smaller expert_tensor_parallel_size, tensor-) parallel ranks, so it needs no extra GPUs.
  int expert_model_parallel_size = 1;
  /// Tensor parallelism inside each expert; 0 means tensor_model_parallel_size (Megatron's None). MoE recipes usually
  /// set 1, which leaves more ranks for expert parallelism. Read it through expert_tensor_parallel_size(options).
  int expert_tensor_parallel_size = 0;
  std::string order = "tp-cp-ep-dp-pp";
};

/// The expert tensor-parallel size in effect: options.expert_tensor_parallel_size, or tensor_model_parallel_size
/// when it is 0.
int expert_tensor_parallel_size(const ParallelOptions& options);

/// The groups of one rank, each as ascending-by-position global ranks as Megatron lists them.
struct RankLayout {
  int world_size = 1;
  int rank = 0;
  ParallelOptions options;
  int data_parallel_size = 1;
  /// world / (expert tp x ep x pp): the ranks that hold the same experts and average their gradients.
  int expert_data_parallel_size = 1;

  std::vector<int> tensor_model_parallel;     ///< "tp"
  std::vector<int> pipeline_model_parallel;   ///< "pp"
  std::vector<int> data_parallel;             ///< "dp"
  std::vector<int> context_parallel;          ///< "cp"
  std::vector<int> data_parallel_with_cp;     ///< "dp-cp": reduces gradients, shards the optimizer
  std::vector<int> model_parallel;            ///< "tp-pp": reduces grad-norm statistics
  std::vector<int> tensor_and_data_parallel;  ///< "tp-dp"
  /// "tp-cp": the ranks that share one sequence's tokens (the router's aux-loss statistics are summed over it).
  std::vector<int> tensor_and_context_parallel;
  /// "tp-dp-cp": every rank of one pipeline stage (expert-bias token counts, the global aux loss).
  std::vector<int> tensor_and_data_parallel_with_cp;
  std::vector<int> embedding;           ///< first and last pipeline stage; empty if this rank is in neither
  std::vector<int> position_embedding;  ///< first pipeline stage; empty if this rank is not on it

  // The expert generator's groups (Megatron's _EXPERT_* groups).
  std::vector<int> expert_model_parallel;   ///< "ep": the token dispatcher's all-to-all; each member has other experts
  std::vector<int> expert_tensor_parallel;  ///< "tp": splits each expert's weights
  std::vector<int> expert_tensor_and_model_parallel;       ///< "tp-ep": the dispatcher's tp_ep group
  std::vector<int> expert_tensor_model_pipeline_parallel;  ///< "tp-ep-pp": norms of expert parameters
  std::vector<int> expert_data_parallel;                   ///< "dp": reduces expert gradients

  /// This rank's position in `group` (which must contain it).
  int rank_in(const std::vector<int>& group) const;
  int tensor_model_parallel_rank() const { return rank_in(tensor_model_parallel); }
  int pipeline_model_parallel_rank() const { return rank_in(pipeline_model_parallel); }
  /// With `with_context_parallel`, the rank in dp x cp: 0 on exactly one rank per model-parallel shard.
  int data_parallel_rank(bool with_context_parallel = false) const {
    return rank_in(with_context_parallel ? data_parallel_with_cp : data_parallel);
  }
  int context_parallel_rank() const { return rank_in(context_parallel); }
  /// Which slice of the experts this rank holds.
  int expert_model_parallel_rank() const { return rank_in(expert_model_parallel); }
  int expert_tensor_parallel_rank() const { return rank_in(expert_tensor_parallel); }
  int expert_data_parallel_rank() const { return rank_in(expert_data_parallel); }
};

/// Validates `options` against `world_size` (std::invalid_argument naming the field and the fix) and returns the
/// layout of `rank`. Refuses, as Megatron-Core does, a world not divisible by tp x cp x pp or by expert tp x ep x pp,
/// and an order not ending in "pp" whose dense and expert pipeline groups would differ. Expert and context
/// parallelism combine: ep folds over dp x cp.
RankLayout compute_rank_layout(int world_size, int rank, const ParallelOptions& options);

}  // namespace bridge::parallel
