// The four tensor-parallel region operators (Megatron's mappings.py), as autograd functions over the
// tensor-model-parallel group. Activations are sequence-first [s, b, h]; split and gather act on the last dim.
//
//   operator                                   forward                  backward
//   copy_to_tensor_model_parallel_region       identity                 all-reduce (sum)
//   reduce_from_tensor_model_parallel_region   all-reduce (sum)         identity
//   scatter_to_tensor_model_parallel_region    keep own last-dim chunk  all-gather last dim
//   gather_from_tensor_model_parallel_region   all-gather last dim      keep own last-dim chunk
//
// With tp == 1 each returns its input unchanged: no autograd node, no communication. The input is never modified.
#pragma once

#include <torch/torch.h>

namespace bridge::parallel::tensor_parallel {

torch::Tensor copy_to_tensor_model_parallel_region(const torch::Tensor& input);
torch::Tensor reduce_from_tensor_model_parallel_region(const torch::Tensor& input);
torch::Tensor scatter_to_tensor_model_parallel_region(const torch::Tensor& input);
torch::Tensor gather_from_tensor_model_parallel_region(const torch::Tensor& input);

}  // namespace bridge::parallel::tensor_parallel
