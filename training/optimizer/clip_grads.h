// Megatron's global gradient norm and clipping (optimizer/clip_grads.py): the L2 norm of all gradients of the model,
// each counted once across tensor and pipeline parallelism, and the rescaling of every gradient when it is too large.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "parallel/process_group.h"

namespace bridge::training {

/// Megatron's get_grad_norm_fp32: L2 norm of the grads of `params` over the model-parallel group (tensor x pipeline),
/// each gradient counted once: tensor-parallel duplicates (non-TP params on tp rank != 0) and the last stage's shared
/// embedding copy are skipped. Grads are assumed already data-parallel reduced. Params without a grad are ignored.
/// nullptr group = parallel_state::get_model_parallel_group(). Squares are summed in fp64.
double get_grad_norm_fp32(const std::vector<torch::Tensor>& params,
                          parallel::ProcessGroup* model_parallel_group = nullptr);
/// Scales every grad by max_norm / (total + 1e-6) when that is < 1. Returns the total norm before clipping.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                      parallel::ProcessGroup* model_parallel_group = nullptr);

}  // namespace bridge::training
