// The parallel layout as one rank sees it: the global ranks of every group it belongs to, computed from the world
// size and Megatron's initialize_model_parallel arguments. Pure, so tests check every rank of a job in one process.
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
  int context_parallel_size = 1;       ///< Kept in the arithmetic; the layers support only 1 so far.
  int expert_model_parallel_size = 1;  ///< Likewise.
  std::string order = "tp-cp-ep-dp-pp";
};

/// The groups of one rank, each as ascending-by-position global ranks as Megatron lists them.
struct RankLayout {
  int world_size = 1;
  int rank = 0;
  ParallelOptions options;
  int data_parallel_size = 1;

  std::vector<int> tensor_model_parallel;     ///< "tp"
  std::vector<int> pipeline_model_parallel;   ///< "pp"
  std::vector<int> data_parallel;             ///< "dp"
  std::vector<int> context_parallel;          ///< "cp"
  std::vector<int> data_parallel_with_cp;     ///< "dp-cp"
  std::vector<int> model_parallel;            ///< "tp-pp": reduces grad-norm statistics
  std::vector<int> tensor_and_data_parallel;  ///< "tp-dp"
  std::vector<int> embedding;                 ///< first and last pipeline stage; empty if this rank is in neither
  std::vector<int> position_embedding;        ///< first pipeline stage; empty if this rank is not on it

  /// This rank's position in `group` (which must contain it).
  int rank_in(const std::vector<int>& group) const;
  int tensor_model_parallel_rank() const { return rank_in(tensor_model_parallel); }
  int pipeline_model_parallel_rank() const { return rank_in(pipeline_model_parallel); }
  int data_parallel_rank() const { return rank_in(data_parallel); }
};

/// Validates `options` against `world_size` (std::invalid_argument naming the field and the fix) and returns the
/// layout of `rank`.
RankLayout compute_rank_layout(int world_size, int rank, const ParallelOptions& options);

}  // namespace bridge::parallel
