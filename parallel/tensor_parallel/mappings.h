// The tensor-parallel region operators (Megatron's mappings.py), as autograd functions. Activations are
// sequence-first [s, b, h]; split and gather act on the last dim. Without a group argument they run over the
// tensor-model-parallel group:
//
//   operator                                   forward                  backward
//   copy_to_tensor_model_parallel_region       identity                 all-reduce (sum)
//   reduce_from_tensor_model_parallel_region   all-reduce (sum)         identity
//   scatter_to_tensor_model_parallel_region    keep own last-dim chunk  all-gather last dim
//   gather_from_tensor_model_parallel_region   all-gather last dim      keep own last-dim chunk
//
// Sequence parallelism (Korthikanti et al. 2022) adds three that act on the sequence, dim 0:
//
//   scatter_to_sequence_parallel_region        keep own dim-0 chunk     all-gather dim 0
//   gather_from_sequence_parallel_region       all-gather dim 0         reduce-scatter dim 0 (or keep own chunk)
//   reduce_scatter_to_sequence_parallel_region reduce-scatter dim 0     all-gather dim 0
//
// For MoE token dispatchers (Megatron-Core's token_dispatcher.py), which move uneven numbers of tokens between
// expert-parallel ranks, these take an explicit group and split sizes (rows of dim 0 per group rank):
//
//   all_to_all(group, x, out_splits, in_splits)                  all-to-all dim 0      all-to-all, splits swapped
//   gather_from_sequence_parallel_region(group, x, g, splits)    all-gather dim 0      reduce-scatter (or own rows)
//   reduce_scatter_to_sequence_parallel_region(group, x, splits) reduce-scatter dim 0  all-gather dim 0
//
// With a group of one each returns its input unchanged: no autograd node, no communication. The input is never
// modified.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "parallel/process_group.h"

namespace bridge::parallel::tensor_parallel {

torch::Tensor copy_to_tensor_model_parallel_region(const torch::Tensor& input);
torch::Tensor reduce_from_tensor_model_parallel_region(const torch::Tensor& input);
torch::Tensor scatter_to_tensor_model_parallel_region(const torch::Tensor& input);
torch::Tensor gather_from_tensor_model_parallel_region(const torch::Tensor& input);

torch::Tensor scatter_to_sequence_parallel_region(const torch::Tensor& input);
/// tensor_parallel_output_grad: the gradient arriving in backward is each rank's partial sum (the usual case: the
/// output feeds a tensor-parallel GEMM) and is reduce-scattered; false when it is already the full gradient on every
/// rank, which is then only split.
torch::Tensor gather_from_sequence_parallel_region(const torch::Tensor& input, bool tensor_parallel_output_grad = true);
torch::Tensor reduce_scatter_to_sequence_parallel_region(const torch::Tensor& input);

/// Megatron's all_to_all (_AllToAll): group rank j gets rows [sum(input_split_sizes[:j]), + input_split_sizes[j]) of
/// `input`, and the result holds output_split_sizes[i] rows from each group rank i, in rank order (see
/// ProcessGroup::all_to_all; empty vectors mean equal splits). Backward sends the gradient back the same way with the
/// splits swapped. `group` must outlive the backward pass.
torch::Tensor all_to_all(ProcessGroup& group, const torch::Tensor& input, std::vector<int64_t> output_split_sizes = {},
                         std::vector<int64_t> input_split_sizes = {});
/// All-gather along dim 0 over `group`. With output_split_sizes (one per group rank, the same on every rank) rank i
/// contributes output_split_sizes[i] rows, which must be this rank's input.size(0); without, every rank's input has
/// the same rows. Backward reduce-scatters the gradient along dim 0 in the same rows when
/// tensor_parallel_output_grad (see the overload above), else keeps this rank's rows. `group` must outlive backward.
torch::Tensor gather_from_sequence_parallel_region(ProcessGroup& group, const torch::Tensor& input,
                                                   bool tensor_parallel_output_grad,
                                                   std::vector<int64_t> output_split_sizes = {});
/// Reduce-scatter along dim 0 over `group`: the sum over the group of `input`, of which rank i keeps
/// input_split_sizes[i] rows (one per group rank, the same on every rank, summing to input.size(0)), or an equal
/// chunk without them. Backward all-gathers the gradient in the same rows. `group` must outlive backward.
torch::Tensor reduce_scatter_to_sequence_parallel_region(ProcessGroup& group, const torch::Tensor& input,
                                                         std::vector<int64_t> input_split_sizes = {});

/// The collectives under those operators, without autograd (Megatron's _gather_along_first_dim and
/// _reduce_scatter_along_first_dim): for layers whose own autograd function communicates in backward.
torch::Tensor gather_along_first_dim(const torch::Tensor& input);
torch::Tensor reduce_scatter_along_first_dim(const torch::Tensor& input);
/// The same over `group`, uneven when split sizes are given (as the operators above take them). The uneven ones are
/// one ProcessGroup::all_to_all each, which moves no padding (a padded equal all-gather would move size() times the
/// largest part): the gather sends this rank's rows to every member (staging size() copies of its input); the
/// reduce-scatter sends each member its rows of every rank's input and sums what arrives, in group-rank order. A
/// group of one returns the input (after checking the splits).
torch::Tensor gather_along_first_dim(ProcessGroup& group, const torch::Tensor& input,
                                     const std::vector<int64_t>& output_split_sizes = {});
torch::Tensor reduce_scatter_along_first_dim(ProcessGroup& group, const torch::Tensor& input,
                                             const std::vector<int64_t>& input_split_sizes = {});

}  // namespace bridge::parallel::tensor_parallel
