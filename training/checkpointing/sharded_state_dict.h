// Where this rank's tensors lie in Megatron-Core's torch_dist checkpoints (its sharded_state_dict): the sharded key
// each parameter is saved under, the global shape with the axes Megatron-Core prepends, and the chunks (boxes of the
// global tensor) this rank holds. A checkpoint of any parallel layout then reads as a set of box intersections.
//
// Megatron-Core's keys (dist_checkpoint.md, section 2):
//   - transformer layers are stacked on a leading axis of the model's layer count:
//   decoder.layers.0.input_layernorm.weight
//     is chunk [0] of decoder.layers.input_layernorm.weight [num_layers, hidden]; a model whose layers differ (an MoE
//     layer frequency other than every layer) keeps per-layer keys (Megatron-Core's non_homogeneous_layers);
//   - the routed experts are stacked on an expert axis after it: local_experts.<g>.linear_fc1.weight of layer N is
//     chunk [N, g] of decoder.layers.mlp.experts.experts.linear_fc1.weight [num_layers, num_experts, rows, cols];
//   - a tensor-parallel weight is one chunk per contiguous block (the SwiGLU fc1's gate and up halves are two: the
//     global tensor is [gate of every rank; up of every rank], whatever the tensor-parallel size).
//
//   for (const ShardedChunk& chunk : sharded_chunks(name, layout, key_options)) write(chunk.key, chunk_data(tensor,
//   chunk));
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bridge/models/gpt_config.h"
#include "parallel/dist_checkpointing/sharded_tensor.h"

namespace bridge::training {

/// What the keys depend on: the model's layer and expert counts and whether its layers are alike.
struct ShardedKeyOptions {
  int64_t num_layers = 0;
  int64_t num_experts = 0;
  bool homogeneous_layers = true;  ///< stack the layers on a leading axis (Megatron-Core's default)
  static ShardedKeyOptions from(const models::GPTConfig& config);
};

/// One box of a global tensor in a torch_dist checkpoint, and which part of this rank's tensor it is.
struct ShardedChunk {
  std::string key;                    ///< Megatron-Core's sharded key
  std::vector<int64_t> global_shape;  ///< with the prepended layer and expert axes
  std::vector<int64_t> offsets;       ///< the box's place in the global tensor
  std::vector<int64_t> sizes;         ///< its extent (1 on the prepended axes)
  int64_t prepended = 0;              ///< how many axes were prepended (0, 1 or 2)
  int64_t local_dim = -1;             ///< the local tensor's dim the box narrows (-1: the whole tensor)
  int64_t local_start = 0;
  int64_t local_length = 0;
};

/// One chunk a rank may write, with its values.
struct SaveItem {
  ShardedChunk chunk;
  torch::Tensor data;  ///< shaped as chunk.sizes
};

/// Megatron-Core's key of the parameter (or buffer) bridge names `name` (its global, per-layer, per-expert name),
/// with the layer and global expert index it stands for (-1 when none).
std::string sharded_key(const std::string& name, const ShardedKeyOptions& options, int64_t* layer = nullptr,
                        int64_t* expert = nullptr);

/// The chunks of `name` this rank holds, laid out as `layout` says (its global shape and tensor-parallel blocks).
std::vector<ShardedChunk> sharded_chunks(const std::string& name,
                                         const parallel::dist_checkpointing::ShardedTensorLayout& layout,
                                         const ShardedKeyOptions& options);

/// The part of `local` (this rank's tensor, laid out as the chunk's layout) that `chunk` is, shaped as the chunk's
/// sizes (a view where possible).
torch::Tensor chunk_data(const torch::Tensor& local, const ShardedChunk& chunk);

/// A box of this rank's tensor that lies within a flat range of its elements and within one chunk: how a
/// distributed optimizer's shard of a parameter (flattened elements [begin, end)) is saved in model space without
/// gathering it. `chunk` is the box's place in the global tensor; local_offsets/local_sizes its place in the local
/// tensor (1-D or 2-D).
struct FlatBox {
  ShardedChunk chunk;
  std::vector<int64_t> local_offsets;
  std::vector<int64_t> local_sizes;
};
/// The boxes covering flattened elements [begin, end) of a local tensor of `local_shape` whose chunks are `chunks`:
/// per chunk at most three (a partial first row, whole rows, a partial last row).
std::vector<FlatBox> flat_range_boxes(const std::vector<ShardedChunk>& chunks, c10::IntArrayRef local_shape,
                                      int64_t begin, int64_t end);
/// The values of `box` taken from `flat` (the elements [begin, end) of the local tensor, flattened), shaped as the
/// box's chunk sizes.
torch::Tensor flat_box_data(const torch::Tensor& flat, c10::IntArrayRef local_shape, int64_t begin, const FlatBox& box);

/// Megatron-Core's dp_reshardable key of a distributed-optimizer bucket, without the state's name:
/// "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0", to which
/// ".param", ".exp_avg" or ".exp_avg_sq" is appended; the tensor is 1-D, of the bucket's unpadded size.
std::string distributed_optimizer_bucket_key(int64_t dp_group_idx, int64_t gbuf_idx, c10::ScalarType param_dtype,
                                             c10::ScalarType grad_dtype, int64_t bucket_idx);
/// "optimizer.distributed.dp_group_idx_<g>.<name>": the prefix of a data-parallel domain's objects.
std::string distributed_optimizer_domain_key(int64_t dp_group_idx, const std::string& name);

/// One 1-D chunk a data-parallel rank writes of a bucket in the dp_reshardable layout: a parameter's slice (param >=
/// 0, its elements [param_offset, param_offset + length)) or padding between slices (param -1), at bucket_offset.
struct BucketSlice {
  int64_t param = -1;
  int64_t bucket_offset = 0;
  int64_t param_offset = 0;
  int64_t length = 0;
};
/// The chunks of the bucket elements [shard_begin, shard_end) (a rank's shard) within [0, numel_unpadded): one per
/// parameter slice (parameter i at `offsets[i]`, `numels[i]` elements) and one per gap between them, so that every
/// rank's chunks together cover the bucket's global shape exactly, as Megatron-Core's padding chunks do.
std::vector<BucketSlice> bucket_slices(const std::vector<int64_t>& offsets, const std::vector<int64_t>& numels,
                                       int64_t numel_unpadded, int64_t shard_begin, int64_t shard_end);

/// The other way: the global names a saved tensor `key` of `global_shape` holds, each with the offsets of its part
/// along the prepended axes (a stacked layer key holds one name per layer, an expert key one per layer and expert).
struct NamedPart {
  std::string name;
  std::vector<int64_t> prefix;  ///< offsets along the prepended axes (empty: the whole tensor)
};
std::vector<NamedPart> named_parts(const std::string& key, const std::vector<int64_t>& global_shape,
                                   const ShardedKeyOptions& options);

/// Whether `name` is a vocabulary-padded tensor (the embedding, the output layer): its first dimension may differ
/// between checkpoint and model (Megatron-Core's allow_shape_mismatch); the common rows are read.
bool is_vocab_padded(const std::string& name);

}  // namespace bridge::training
