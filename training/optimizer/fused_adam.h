// FusedAdamW: torch::optim::AdamW whose step runs LibTorch 2.x's fused AdamW kernel (at::_fused_adamw_: one pass over
// each parameter instead of AdamW's six elementwise ops, vectorised and threaded on CPU, multi-tensor on CUDA).
// Same options, same per-parameter state (AdamWParamState: step, exp_avg, exp_avg_sq) and same save/load as AdamW,
// so checkpoints move between the two and the scheduler sets each group's lr as before. On LibTorch 1.x (no fused
// kernel) the step is AdamW's own.
//
//   std::vector<torch::optim::OptimizerParamGroup> groups = ...;  // decay / no decay, as build_optimizer builds them
//   FusedAdamW optimizer(groups, torch::optim::AdamWOptions(3e-4).weight_decay(0.1));
//   optimizer.step();
#pragma once

#include <torch/torch.h>

#include <vector>

namespace bridge::training {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  torch::Tensor step(LossClosure closure = nullptr) override;

  /// True where this build's LibTorch has the fused kernel, i.e. step() does not fall back to AdamW's.
  static bool fused_available();
};

}  // namespace bridge::training
