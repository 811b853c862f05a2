// Grad norm and clipping: one norm kernel per gradient, the per-tensor norms stacked and squared in one pass, one
// all-reduce of a single number over the model-parallel group (a second over the expert model-parallel group when the
// experts' differs) and one read back.
#include "training/optimizer/clip_grads.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"

namespace bridge::training {
namespace {

// Each parameter once (a list may repeat a tied weight), only those with a grad.
std::vector<torch::Tensor> params_with_grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  out.reserve(params.size());
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const torch::Tensor& param : params) {
    if (!param.defined() || !param.grad().defined()) continue;
    if (seen.insert(param.unsafeGetTensorImpl()).second) out.push_back(param);
  }
  return out;
}

// Every rank takes part in the all-reduces, also with nothing to count (a rank of replicas only). On the host on
// every rank: a rank with nothing to count has no device tensor, and all members must reduce on the same backend.
torch::Tensor sum_of_squares(const std::vector<torch::Tensor>& norms) {
  return norms.empty() ? torch::zeros({1}, torch::kFloat64) : torch::stack(norms).square().sum().view({1}).cpu();
}

bool same_ranks(const parallel::ProcessGroup& a, const parallel::ProcessGroup& b) {
  return &a == &b || a.global_ranks() == b.global_ranks();
}

double grad_norm(const std::vector<torch::Tensor>& with_grads, parallel::ProcessGroup* group,
                 parallel::ProcessGroup* expert_group) {
  namespace tp = parallel::tensor_parallel;
  const bool default_groups = group == nullptr;
  if (group == nullptr) group = &parallel::get_model_parallel_group();
  if (expert_group == nullptr) {
    expert_group = default_groups && tp::expert_parallel_groups_in_use()
                       ? &parallel::get_expert_tensor_model_pipeline_parallel_group()
                       : group;
  }
  std::vector<torch::Tensor> dense_norms, expert_norms;
  dense_norms.reserve(with_grads.size());
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& param : with_grads) {
    if (!tp::param_is_not_shared(param) || tp::param_is_tensor_parallel_duplicate(param)) continue;
    (tp::is_expert_parallel_param(param) ? expert_norms : dense_norms)
        .push_back(param.grad().norm().to(torch::kFloat64));
  }
  torch::Tensor dense = sum_of_squares(dense_norms);
  torch::Tensor expert = sum_of_squares(expert_norms);
  if (same_ranks(*group, *expert_group)) {
    dense.add_(expert);
    if (group->size() > 1) group->all_reduce(dense, parallel::ReduceOp::kSum);
    return std::sqrt(dense.item<double>());
  }
  // Megatron's non-distributed optimizers: each kind's squares over its own model-parallel group, then one total.
  if (group->size() > 1) group->all_reduce(dense, parallel::ReduceOp::kSum);
  if (expert_group->size() > 1) expert_group->all_reduce(expert, parallel::ReduceOp::kSum);
  return std::sqrt(dense.item<double>() + expert.item<double>());
}

}  // namespace

double get_grad_norm_fp32(const std::vector<torch::Tensor>& params, parallel::ProcessGroup* model_parallel_group,
                          parallel::ProcessGroup* expert_model_parallel_group) {
  return grad_norm(params_with_grads(params), model_parallel_group, expert_model_parallel_group);
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                      parallel::ProcessGroup* model_parallel_group,
                      parallel::ProcessGroup* expert_model_parallel_group) {
  if (!(max_norm > 0)) {
    throw std::invalid_argument("clip_grad_norm: max_norm must be > 0, got " + std::to_string(max_norm) +
                                "; to disable clipping, do not call it (optimizer.clip_grad = 0)");
  }
  const std::vector<torch::Tensor> with_grads = params_with_grads(params);
  const double total = grad_norm(with_grads, model_parallel_group, expert_model_parallel_group);
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1.0) {
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& param : with_grads) param.grad().mul_(coefficient);
  }
  return total;
}

}  // namespace bridge::training
