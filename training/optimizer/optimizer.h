// The optimizer Megatron builds: Adam with decoupled weight decay (AdamW) or SGD with momentum, over two parameter
// groups, weight decay on matrices and none on biases and norm weights.
//
//   OptimizerConfig config;
//   config.lr = 3e-4;
//   auto optimizer = build_optimizer(config, model->parameters());
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <memory>
#include <string>
#include <vector>

namespace bridge::training {

struct OptimizerConfig {
  std::string optimizer = "adam";  ///< "adam" (decoupled weight decay, i.e. AdamW, as Megatron's fused Adam) or "sgd"
  double lr = 1e-4;                ///< peak learning rate
  double min_lr = 0.0;
  double weight_decay = 0.01;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  double sgd_momentum = 0.9;
  double clip_grad = 1.0;  ///< global gradient-norm clip; 0 disables
  /// Megatron's distributed optimizer (ZeRO-1, distrib_optimizer.h): each data-parallel rank keeps the state of its
  /// 1/dp of the parameters. Must equal ddp.use_distributed_optimizer, as in Megatron-Bridge.
  bool use_distributed_optimizer = false;
  /// Throws std::invalid_argument naming the field ("optimizer.lr must be > 0, got -1") and the fix.
  void validate() const;
};

/// Two parameter groups as Megatron: weight decay on matrices, none on biases and norm weights (every 1-D param).
/// Params that do not require grad are left out; the decayed group comes first, and an empty group is omitted.
std::unique_ptr<torch::optim::Optimizer> build_optimizer(const OptimizerConfig& config,
                                                         const std::vector<torch::Tensor>& params);
/// The same two groups with the split given (the distributed optimizer's 1-D pieces of matrices are decayed):
/// `decayed` take optimizer.weight_decay, `not_decayed` none. Every tensor is taken as it is.
std::unique_ptr<torch::optim::Optimizer> build_optimizer(const OptimizerConfig& config,
                                                         const std::vector<torch::Tensor>& decayed,
                                                         const std::vector<torch::Tensor>& not_decayed);

/// The key of `param` in torch::optim::Optimizer::state(): its TensorImpl's address, which LibTorch 1.x keeps as a
/// string and 2.x as a pointer.
inline auto optimizer_state_key(const torch::Tensor& param) {
#if TORCH_VERSION_MAJOR < 2
  return c10::guts::to_string(param.unsafeGetTensorImpl());
#else
  return static_cast<void*>(param.unsafeGetTensorImpl());
#endif
}

}  // namespace bridge::training
