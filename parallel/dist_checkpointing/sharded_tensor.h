// Where one rank's tensor sits in the whole (global) tensor, so that a checkpoint saved in one parallel layout loads
// in any other (Megatron-Core's dist_checkpointing ShardedTensor, reduced to what GPT needs). A tensor-parallel
// parameter holds `partition_stride` blocks of the global tensor along `partition_dim` (the fused QKV weight holds its
// heads' rows of Q, of K and of V); a replicated one holds the whole tensor.
//
//   ShardedTensorLayout saved = sharded_tensor_layout(param);       // at save time, on the saving rank
//   ...
//   int64_t rows = copy_overlap(target, sharded_tensor_layout(target_param), saved_tensor, saved);
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace bridge::parallel::dist_checkpointing {

struct ShardedTensorLayout {
  /// One contiguous run of the local tensor along partition_dim and where it lies in the global tensor.
  struct Block {
    int64_t local_start = 0;
    int64_t global_start = 0;
    int64_t length = 0;
  };
  std::vector<int64_t> global_shape;
  int64_t partition_dim = -1;  ///< -1: the rank holds the whole tensor (blocks empty)
  std::vector<Block> blocks;

  bool replicated() const { return partition_dim < 0; }
  /// "[256, 32] split on dim 0 in 2 blocks" or "[32] replicated", for error messages.
  std::string describe() const;
};

/// The layout of `param` on this rank, from its tensor-parallel attributes and the current tensor-parallel group (the
/// expert tensor-parallel group for an expert-parallel parameter, attribute allreduce false): block j of a stride-s
/// parameter on rank r of t is global chunk j * t + r (Megatron's _initialize_affine_weight).
ShardedTensorLayout sharded_tensor_layout(const torch::Tensor& param);

/// Copies into `target` (laid out as `target_layout`) the part of the global tensor that `source` (laid out as
/// `source_layout`) holds and `target` needs. The two global shapes must agree except along the partition dimension,
/// where only the common prefix is copied (a vocabulary padded differently). Returns the number of positions along
/// the partition dimension written (the whole first dimension's length for two replicated tensors).
int64_t copy_overlap(torch::Tensor& target, const ShardedTensorLayout& target_layout, const torch::Tensor& source,
                     const ShardedTensorLayout& source_layout);

/// What copy_overlap would return, without copying: to check a checkpoint before anything is modified.
int64_t count_overlap(const ShardedTensorLayout& target_layout, const ShardedTensorLayout& source_layout);

/// How many positions copy_overlap must write, summed over every source of the global tensor, for `target_layout` to
/// be complete: all it holds along the partition dimension, less what lies beyond `source_layout`'s global extent.
int64_t positions_needed(const ShardedTensorLayout& target_layout, const ShardedTensorLayout& source_layout);

/// For checkpoints: {"global_shape": [...], "partition_dim": d, "blocks": [[local, global, length], ...]} as a
/// generic IValue dict (Python reads it as plain dicts and lists), and back. from_ivalue throws std::runtime_error
/// naming `what` when the entry is malformed.
c10::IValue to_ivalue(const ShardedTensorLayout& layout);
ShardedTensorLayout layout_from_ivalue(const c10::IValue& value, const std::string& what);

}  // namespace bridge::parallel::dist_checkpointing
