// Per-parameter model-parallel attributes. Megatron sets Python attributes on parameters (tensor_model_parallel,
// partition_dim, partition_stride, shared_embedding, sequence_parallel, allreduce); C++ tensors have no such slots, so
// a registry keyed by the parameter's TensorImpl keeps them. The grad norm, checkpointing, data-parallel reduction and
// the optimizer read them back.
//
// The key is the TensorImpl: `param`, copies of it and `module->parameters()` share it, but `param.detach()`,
// `param.data()` and `param.clone()` are new tensors without attributes. An entry dies with its tensor.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace bridge::parallel::tensor_parallel {

struct ParamAttributes {
  bool tensor_model_parallel = false;  ///< sharded across the tensor-parallel group
  int64_t partition_dim = -1;          ///< the sharded dimension, -1 if replicated
  int64_t partition_stride = 1;        ///< Megatron's stride: chunks per rank interleaved along partition_dim
  bool shared_embedding = false;       ///< the last pipeline stage's copy of the tied word embedding
  /// Replicated, but used on this rank's part of the sequence only (norms and row-parallel biases under sequence
  /// parallelism): its gradient is partial and is summed over the tensor-parallel group.
  bool sequence_parallel = false;
  /// Megatron's `allreduce`: false for an expert-parallel parameter (an MoE expert's weight when
  /// expert_model_parallel_size > 1 or the expert tensor-parallel size differs from the tensor-parallel size). Its
  /// gradient is reduced over the expert data-parallel group instead of the data-parallel one, its norm over the
  /// expert tensor x model x pipeline group, and the distributed optimizer shards it over the expert data-parallel
  /// group. With ep 1 and expert tp = tp, experts keep true and are treated as dense, as in Megatron.
  bool allreduce = true;
};

void set_param_attributes(const torch::Tensor& param, ParamAttributes attributes);
/// The attributes set on `param`, or defaults (replicated, not shared) if none were.
ParamAttributes get_param_attributes(const torch::Tensor& param);
/// A replica of a replicated parameter on a tensor-parallel rank other than 0: counted once by the grad norm. For an
/// expert-parallel parameter the rank is the expert tensor-parallel one (Megatron's param_is_not_tensor_parallel_
/// duplicate with the expert tp group): its replicas live across that group, and the dense tp group may hold other
/// experts.
bool param_is_tensor_parallel_duplicate(const torch::Tensor& param);
/// Whether `param` is an expert-parallel parameter (attribute allreduce false).
bool is_expert_parallel_param(const torch::Tensor& param);
/// Whether parallel_state is initialized with expert groups unlike the dense ones (expert_model_parallel_size > 1 or
/// expert tp != tp): the layouts in which a model marks its experts allreduce = false. Collectives over the expert
/// groups that every rank must join (the norms) are decided by this, the same on every rank, not by whether this rank
/// holds an expert parameter: a pipeline stage without MoE layers still takes part.
bool expert_parallel_groups_in_use();
bool param_is_not_shared(const torch::Tensor& param);
/// Marks every parameter of `module` (a norm under sequence parallelism) sequence_parallel, keeping its other
/// attributes.
void mark_sequence_parallel(const torch::nn::Module& module);

}  // namespace bridge::parallel::tensor_parallel
