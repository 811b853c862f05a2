// Megatron's global gradient norm and clipping (optimizer/clip_grads.py): the L2 norm of all gradients of the model,
// each counted once across tensor and pipeline parallelism, and the rescaling of every gradient when it is too large.
// With expert parallelism the experts' squares are summed over the expert groups and the dense ones over the dense
// groups, and one total norm clips both (Megatron's ChainedOptimizer of a dense and an expert optimizer).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "parallel/process_group.h"

namespace bridge::training {

/// Megatron's get_grad_norm_fp32: L2 norm of the grads of `params` over the model-parallel group (tensor x pipeline),
/// each gradient counted once: tensor-parallel duplicates (non-TP params on tp rank != 0, an expert's on expert tp
/// rank != 0) and the last stage's shared embedding copy are skipped. Grads are assumed already data-parallel reduced.
/// Params without a grad are ignored. Squares are summed in fp64; the result is sqrt(dense^2 + expert^2), where
/// - dense^2 sums the squares of dense params' grads over `model_parallel_group` (nullptr = parallel_state's
///   model-parallel group);
/// - expert^2 sums those of expert-parallel params (allreduce false) over `expert_model_parallel_group`. nullptr: with
///   `model_parallel_group` nullptr too, parallel_state's expert tensor x model x pipeline group when its layout has
///   expert parallelism (every rank then joins that reduction, also one without experts: a pipeline stage without MoE
///   layers); otherwise the same group as the dense squares (one reduction: the distributed optimizer's world, where
///   each element of either kind is on one rank).
/// Two groups with the same ranks share one all-reduce.
double get_grad_norm_fp32(const std::vector<torch::Tensor>& params,
                          parallel::ProcessGroup* model_parallel_group = nullptr,
                          parallel::ProcessGroup* expert_model_parallel_group = nullptr);
/// Scales every grad, dense and expert alike, by max_norm / (total + 1e-6) when that is < 1 (total: the norm above,
/// over the same groups). Returns the total norm before clipping.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                      parallel::ProcessGroup* model_parallel_group = nullptr,
                      parallel::ProcessGroup* expert_model_parallel_group = nullptr);

}  // namespace bridge::training
