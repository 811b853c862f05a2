// Grad norm and clipping: one norm kernel per gradient, the per-tensor norms stacked and squared in one pass, one
// all-reduce of a single number over the model-parallel group and one read back.
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

double grad_norm(const std::vector<torch::Tensor>& with_grads, parallel::ProcessGroup* group) {
  if (group == nullptr) group = &parallel::get_model_parallel_group();
  std::vector<torch::Tensor> norms;
  norms.reserve(with_grads.size());
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& param : with_grads) {
    if (!parallel::tensor_parallel::param_is_not_shared(param) ||
        parallel::tensor_parallel::param_is_tensor_parallel_duplicate(param)) {
      continue;
    }
    norms.push_back(param.grad().norm().to(torch::kFloat64));
  }
  // Every rank takes part in the all-reduce, also with nothing to count (a rank of replicas only). On the host on
  // every rank: a rank with nothing to count has no device tensor, and all members must reduce on the same backend.
  torch::Tensor total =
      norms.empty() ? torch::zeros({1}, torch::kFloat64) : torch::stack(norms).square().sum().view({1}).cpu();
  if (group->size() > 1) group->all_reduce(total, parallel::ReduceOp::kSum);
  return std::sqrt(total.item<double>());
}

}  // namespace

double get_grad_norm_fp32(const std::vector<torch::Tensor>& params, parallel::ProcessGroup* model_parallel_group) {
  return grad_norm(params_with_grads(params), model_parallel_group);
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                      parallel::ProcessGroup* model_parallel_group) {
  if (!(max_norm > 0)) {
    throw std::invalid_argument("clip_grad_norm: max_norm must be > 0, got " + std::to_string(max_norm) +
                                "; to disable clipping, do not call it (optimizer.clip_grad = 0)");
  }
  const std::vector<torch::Tensor> with_grads = params_with_grads(params);
  const double total = grad_norm(with_grads, model_parallel_group);
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1.0) {
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& param : with_grads) param.grad().mul_(coefficient);
  }
  return total;
}

}  // namespace bridge::training
