// Mixed precision as Megatron does it: Megatron's grad scalers (optimizer/grad_scaler.py) and the fp32 main
// parameters of Float16OptimizerWithFloat16Params (optimizer/optimizer.py). The model holds bf16/fp16 parameters; the
// optimizer steps on fp32 copies of them using the fp32 main grads (the DDP buffer), then copies them back.
//
//   MixedPrecision mp(config.mixed_precision, model_params);
//   auto optimizer = build_optimizer(config.optimizer, mp.main_params());   // Adam state lives with the fp32 copies
//   ... backward of loss x mp.loss_scale() ...
//   if (!mp.copy_main_grads_and_unscale()) {    // false: an inf/nan gradient, skip the step
//     clip_grad_norm(mp.main_params(), 1.0);
//     optimizer->step();
//     mp.copy_main_params_to_model_params();
//   }
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "parallel/process_group.h"
#include "training/config/config.h"

namespace bridge::training {

/// Megatron's ConstantGradScaler (a fixed scale) or DynamicGradScaler: on an overflowing step the hysteresis count
/// drops and, once it reaches zero, the scale halves (never below min_scale); after growth_interval clean steps in a
/// row the scale doubles and the hysteresis count is restored.
class GradScaler {
 public:
  static GradScaler constant(double scale);
  static GradScaler dynamic(double initial_scale, double min_scale, double growth_factor, double backoff_factor,
                            int64_t growth_interval, int64_t hysteresis);
  /// From mixed_precision: constant with loss_scale set, else dynamic (growth 2, backoff 0.5, as Megatron).
  static GradScaler from_config(const MixedPrecisionConfig& config);

  double scale() const { return scale_; }
  double inv_scale() const { return 1.0 / scale_; }
  bool is_dynamic() const { return dynamic_; }
  /// Megatron's update(found_inf); a constant scaler ignores it.
  void update(bool found_inf);
  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t hysteresis_tracker() const { return hysteresis_tracker_; }
  /// Restores the state a checkpoint saved (Megatron's DynamicGradScaler.load_state_dict); a constant scaler keeps
  /// its configured scale.
  void load_state(double scale, int64_t growth_tracker, int64_t hysteresis_tracker) {
    if (!dynamic_) return;
    scale_ = scale;
    growth_tracker_ = growth_tracker;
    hysteresis_tracker_ = hysteresis_tracker;
  }

 private:
  bool dynamic_ = false;
  double scale_ = 1.0;
  double min_scale_ = 1.0;
  double growth_factor_ = 2.0;
  double backoff_factor_ = 0.5;
  int64_t growth_interval_ = 1000;
  int64_t hysteresis_ = 2;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_ = 2;
};

/// The fp32 side of a bf16/fp16 model: one fp32 main parameter per model parameter (with its model-parallel
/// attributes, so the grad norm counts it as the model parameter), the gradient hand-over and, for fp16, the scaler.
class MixedPrecision {
 public:
  /// `model_params`: the trainable bf16/fp16 parameters (duplicates are dropped). `model_parallel_group`: where
  /// found_inf is agreed; nullptr = parallel_state's model-parallel group.
  MixedPrecision(const MixedPrecisionConfig& config, const std::vector<torch::Tensor>& model_params,
                 parallel::ProcessGroup* model_parallel_group = nullptr);

  const std::vector<torch::Tensor>& model_params() const { return model_params_; }
  /// The fp32 copies the optimizer steps on, one per model parameter in the same order.
  const std::vector<torch::Tensor>& main_params() const { return main_params_; }
  /// The fp16 loss scaler; null for bf16 (Megatron scales only fp16).
  GradScaler* grad_scaler() { return grad_scaler_ ? &*grad_scaler_ : nullptr; }
  /// The current loss scale; 1 without a scaler.
  double loss_scale() const { return grad_scaler_ ? grad_scaler_->scale() : 1.0; }

  /// Megatron's _copy_model_grads_to_main_grads and _unscale_main_grads_and_check_for_nan: every main param's grad
  /// becomes its model param's main_grad (the fp32 buffer view itself, or an fp32 copy of a bf16/fp16 buffer), then
  /// with a scaler the grads are multiplied by 1/scale, checked for inf/nan, the result agreed over the model-parallel
  /// group (collective: every rank of it must call; with parallel_state's group and expert parallelism also over the
  /// expert tensor x model x pipeline group) and the scaler updated. Returns found_inf: true means skip the
  /// optimizer step. Without a scaler no check, no collective, false.
  bool copy_main_grads_and_unscale();
  /// After the optimizer step: the model params take the fp32 main params' values (rounded to their dtype).
  void copy_main_params_to_model_params();

 private:
  std::vector<torch::Tensor> model_params_;
  std::vector<torch::Tensor> main_params_;
  std::optional<GradScaler> grad_scaler_;
  parallel::ProcessGroup* group_;
};

/// The dtype of the model's parameters under `config`: bf16, fp16 or fp32.
torch::Dtype params_dtype(const MixedPrecisionConfig& config);

}  // namespace bridge::training
