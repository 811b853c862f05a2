// OptimizerParamScheduler: Megatron's learning-rate schedule. Linear warmup from init_lr to max_lr, then a decay to
// min_lr (constant, linear, cosine or inverse square root), and min_lr after the decay ends.
//
// As in Megatron, steps are counted in whatever unit step(increment) is given; the loop passes samples (global
// batch size per iteration), so warmup and decay lengths are in samples too.
//
//   OptimizerParamSchedulerOptions options;
//   options.max_lr = 3e-4;
//   options.min_lr = 3e-5;
//   options.lr_warmup_steps = 100;
//   options.lr_decay_steps = 1000;
//   options.lr_decay_style = LrDecayStyle::kCosine;
//   OptimizerParamScheduler scheduler(optimizer, options);
//   scheduler.step(global_batch_size);  // after each optimizer step
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string_view>

namespace bridge::training {

enum class LrDecayStyle : std::uint8_t { kConstant, kLinear, kCosine, kInverseSquareRoot };

/// Parses "constant", "linear", "cosine" or "inverse-square-root"; throws std::invalid_argument naming the choices.
LrDecayStyle parse_lr_decay_style(std::string_view name);

struct OptimizerParamSchedulerOptions {
  double init_lr = 0.0;  ///< Learning rate at step 0 (start of warmup).
  double max_lr = 1e-4;  ///< Learning rate at the end of warmup.
  double min_lr = 0.0;   ///< Floor reached at the end of the decay.
  std::int64_t lr_warmup_steps = 0;
  std::int64_t lr_decay_steps = 1;  ///< Counted from step 0, warmup included.
  LrDecayStyle lr_decay_style = LrDecayStyle::kLinear;
};

class OptimizerParamScheduler {
 public:
  /// Validates the options (throws std::invalid_argument naming the field) and sets the step-0 learning rate.
  OptimizerParamScheduler(torch::optim::Optimizer& optimizer, OptimizerParamSchedulerOptions options);

  /// Advances by `increment` steps and writes the new learning rate to every parameter group.
  void step(std::int64_t increment = 1);
  /// The learning rate at the current step.
  double get_lr() const;
  std::int64_t num_steps() const noexcept { return num_steps_; }
  /// Moves to step `num_steps` (a resumed run's position) and writes its learning rate to every parameter group.
  void set_num_steps(std::int64_t num_steps);
  const OptimizerParamSchedulerOptions& options() const noexcept { return options_; }

 private:
  void apply_lr();

  torch::optim::Optimizer& optimizer_;
  OptimizerParamSchedulerOptions options_;
  std::int64_t num_steps_ = 0;
};

}  // namespace bridge::training
