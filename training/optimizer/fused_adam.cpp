// FusedAdamW::step: gathers each group's parameters, grads and AdamW state into lists and runs at::_fused_adamw_.
#include "training/optimizer/fused_adam.h"

#include <torch/version.h>

#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

// The CPU kernel of _fused_adamw_ arrived in PyTorch 2.4.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define BRIDGE_HAS_FUSED_ADAMW 1
#else
#define BRIDGE_HAS_FUSED_ADAMW 0
#endif

namespace bridge::training {

bool FusedAdamW::fused_available() { return BRIDGE_HAS_FUSED_ADAMW != 0; }

#if BRIDGE_HAS_FUSED_ADAMW

namespace {

// One _fused_adamw_ call's operands: the kernel wants one device and dtype per call.
struct Bucket {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
};

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = {};
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    const auto [beta1, beta2] = options.betas();
    std::map<std::pair<std::string, c10::ScalarType>, Bucket> buckets;
    // The kernel reads each parameter's step count from a float tensor (Python keeps one per parameter); a group's
    // parameters almost always share one count, so one tensor per (device, count) serves them all.
    std::map<std::pair<std::string, int64_t>, torch::Tensor> step_tensors;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse()) {
        throw std::invalid_argument("FusedAdamW: sparse gradients are not supported (parameter of shape " +
                                    c10::str(p.sizes()) + "); use dense gradients");
      }
      auto found = state_.find(p.unsafeGetTensorImpl());
      if (found == state_.end()) {
        // As AdamW initialises it, so that a checkpoint of either optimizer loads into the other.
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        state->step(0);
        state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (options.amsgrad()) state->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        found = state_.emplace(p.unsafeGetTensorImpl(), std::move(state)).first;
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*found->second);
      state.step(state.step() + 1);
      const std::string device = p.device().str();
      torch::Tensor& step = step_tensors[{device, state.step()}];
      if (!step.defined()) {
        step = torch::full({}, static_cast<double>(state.step()), p.options().dtype(torch::kFloat32));
      }
      Bucket& bucket = buckets[{device, p.scalar_type()}];
      bucket.params.push_back(p);
      // The kernel walks memory linearly; a strided grad (rare: grads here are views of a flat buffer) is copied.
      bucket.grads.push_back(p.grad().is_contiguous() ? p.grad() : p.grad().contiguous());
      bucket.exp_avgs.push_back(state.exp_avg());
      bucket.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (options.amsgrad()) bucket.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      bucket.steps.push_back(step);
    }
    for (auto& [key, bucket] : buckets) {
      at::_fused_adamw_(bucket.params, bucket.grads, bucket.exp_avgs, bucket.exp_avg_sqs, bucket.max_exp_avg_sqs,
                        bucket.steps, options.lr(), beta1, beta2, options.weight_decay(), options.eps(),
                        options.amsgrad(), /*maximize=*/false);
    }
  }
  return loss;
}

#else

// LibTorch 1.x: no fused kernel; AdamW's step is the same update.
torch::Tensor FusedAdamW::step(LossClosure closure) { return torch::optim::AdamW::step(std::move(closure)); }

#endif

}  // namespace bridge::training
