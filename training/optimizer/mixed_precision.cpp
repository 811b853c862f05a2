// GradScaler and MixedPrecision: Megatron's loss scaling and fp32 main parameters (see mixed_precision.h).
#include "training/optimizer/mixed_precision.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"

namespace bridge::training {

GradScaler GradScaler::constant(double scale) {
  if (!(scale > 0)) throw std::invalid_argument("GradScaler: the loss scale must be > 0, got " + std::to_string(scale));
  GradScaler scaler;
  scaler.scale_ = scale;
  return scaler;
}

GradScaler GradScaler::dynamic(double initial_scale, double min_scale, double growth_factor, double backoff_factor,
                               int64_t growth_interval, int64_t hysteresis) {
  if (!(initial_scale > 0 && min_scale > 0 && growth_factor > 1 && backoff_factor > 0 && backoff_factor < 1 &&
        growth_interval >= 1 && hysteresis >= 1)) {
    throw std::invalid_argument(
        "GradScaler::dynamic needs initial_scale > 0, min_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, "
        "growth_interval >= 1 and hysteresis >= 1 (Megatron: 2^32, 1, 2, 0.5, 1000, 2)");
  }
  GradScaler scaler;
  scaler.dynamic_ = true;
  scaler.scale_ = initial_scale;
  scaler.min_scale_ = min_scale;
  scaler.growth_factor_ = growth_factor;
  scaler.backoff_factor_ = backoff_factor;
  scaler.growth_interval_ = growth_interval;
  scaler.hysteresis_ = hysteresis;
  scaler.hysteresis_tracker_ = hysteresis;
  return scaler;
}

GradScaler GradScaler::from_config(const MixedPrecisionConfig& config) {
  if (config.loss_scale) return constant(*config.loss_scale);
  return dynamic(config.initial_loss_scale, config.min_loss_scale, 2.0, 0.5, config.loss_scale_window,
                 config.hysteresis);
}

void GradScaler::update(bool found_inf) {
  if (!dynamic_) return;
  if (found_inf) {
    growth_tracker_ = 0;
    hysteresis_tracker_ -= 1;
    // Megatron keeps halving on every further overflow until a growth restores the hysteresis.
    if (hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * backoff_factor_, min_scale_);
  } else {
    growth_tracker_ += 1;
    if (growth_tracker_ == growth_interval_) {
      growth_tracker_ = 0;
      hysteresis_tracker_ = hysteresis_;
      scale_ *= growth_factor_;
    }
  }
}

torch::Dtype params_dtype(const MixedPrecisionConfig& config) {
  if (config.bf16) return torch::kBFloat16;
  if (config.fp16) return torch::kHalf;
  return torch::kFloat32;
}

MixedPrecision::MixedPrecision(const MixedPrecisionConfig& config, const std::vector<torch::Tensor>& model_params,
                               parallel::ProcessGroup* model_parallel_group)
    : group_(model_parallel_group) {
  if (config.fp16) grad_scaler_ = GradScaler::from_config(config);
  torch::NoGradGuard no_grad;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const torch::Tensor& param : model_params) {
    if (!param.defined() || !param.requires_grad() || !seen.insert(param.unsafeGetTensorImpl()).second) continue;
    model_params_.push_back(param);
    torch::Tensor main = param.detach().to(torch::kFloat32).clone().set_requires_grad(true);
    // The grad norm skips tensor-parallel duplicates and the tied copy by these attributes, as Megatron's
    // copy_tensor_model_parallel_attributes and main_param.shared.
    parallel::tensor_parallel::set_param_attributes(main, parallel::tensor_parallel::get_param_attributes(param));
    main_params_.push_back(std::move(main));
  }
}

bool MixedPrecision::copy_main_grads_and_unscale() {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < model_params_.size(); ++i) {
    const torch::Tensor grad = parallel::distributed::main_grad(model_params_[i]);
    torch::Tensor& main_grad = main_params_[i].mutable_grad();
    if (!grad.defined()) {
      main_grad = torch::Tensor();
    } else if (grad.scalar_type() == torch::kFloat32) {
      main_grad = grad;  // the fp32 buffer view itself: no copy (Megatron's .float() of an fp32 tensor)
    } else {
      main_grad = grad.to(torch::kFloat32);
    }
  }
  if (!grad_scaler_ || main_params_.empty()) return false;

  // Megatron's _amp_foreach_non_finite_check_and_unscale_: one flag, read once.
  const double inv_scale = grad_scaler_->inv_scale();
  // On the parameters' device: the flag multiplies each grad's check in place, and CUDA grads cannot write into a
  // CPU tensor. Its all-reduce then goes wherever that device's tensors go (NCCL for CUDA).
  torch::Tensor finite = torch::ones({1}, main_params_.front().options().dtype(torch::kFloat32));
  for (torch::Tensor& main : main_params_) {
    const torch::Tensor& grad = main.grad();
    if (!grad.defined()) continue;
    grad.mul_(inv_scale);
    finite.mul_(torch::isfinite(grad).all().to(torch::kFloat32));
  }
  torch::Tensor found_inf = 1.0 - finite;
  parallel::ProcessGroup* group = group_ != nullptr ? group_ : &parallel::get_model_parallel_group();
  if (group->size() > 1) group->all_reduce(found_inf, parallel::ReduceOp::kMax);
  // With expert parallelism another expert-parallel rank's experts may overflow while this rank's model-parallel
  // group saw none: agreed over the expert model-parallel group too (Megatron's expert optimizer checks there), every
  // rank skips the same steps, or the dense replicas would diverge.
  if (group_ == nullptr && parallel::tensor_parallel::expert_parallel_groups_in_use()) {
    parallel::ProcessGroup& experts = parallel::get_expert_tensor_model_pipeline_parallel_group();
    if (experts.size() > 1 && experts.global_ranks() != group->global_ranks()) {
      experts.all_reduce(found_inf, parallel::ReduceOp::kMax);
    }
  }
  const bool overflow = found_inf.item<float>() > 0.0f;
  grad_scaler_->update(overflow);
  return overflow;
}

void MixedPrecision::copy_main_params_to_model_params() {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < model_params_.size(); ++i) model_params_[i].detach().copy_(main_params_[i]);
}

}  // namespace bridge::training
