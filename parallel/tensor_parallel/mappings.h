// The four tensor-parallel region operators (Megatron's mappings.py), as autograd functions over the
// tensor-model-parallel group. Activations are sequence-first [s, b, h]; split and gather act on the last dim.
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
// With tp == 1 each returns its input unchanged: no autograd node, no communication. The input is never modified.
#pragma once

#include <torch/torch.h>

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

/// The collectives under those operators, without autograd (Megatron's _gather_along_first_dim and
/// _reduce_scatter_along_first_dim): for layers whose own autograd function communicates in backward.
torch::Tensor gather_along_first_dim(const torch::Tensor& input);
torch::Tensor reduce_scatter_along_first_dim(const torch::Tensor& input);

}  // namespace bridge::parallel::tensor_parallel
