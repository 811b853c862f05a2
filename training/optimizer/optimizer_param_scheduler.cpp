// OptimizerParamScheduler: Megatron's get_lr arithmetic, step by step.
#include "training/optimizer/optimizer_param_scheduler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace bridge::training {
namespace {

constexpr double kPi = 3.14159265358979323846;

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("OptimizerParamSchedulerOptions: " + message);
}

}  // namespace

LrDecayStyle parse_lr_decay_style(std::string_view name) {
  if (name == "constant") return LrDecayStyle::kConstant;
  if (name == "linear") return LrDecayStyle::kLinear;
  if (name == "cosine") return LrDecayStyle::kCosine;
  if (name == "inverse-square-root") return LrDecayStyle::kInverseSquareRoot;
  throw std::invalid_argument("lr_decay_style '" + std::string(name) +
                              "' is unknown; choose constant, linear, cosine or inverse-square-root.");
}

OptimizerParamScheduler::OptimizerParamScheduler(torch::optim::Optimizer& optimizer,
                                                 OptimizerParamSchedulerOptions options)
    : optimizer_(optimizer), options_(options) {
  require(options_.max_lr >= 0.0, "max_lr must be >= 0, got " + std::to_string(options_.max_lr));
  require(options_.min_lr >= 0.0 && options_.min_lr <= options_.max_lr,
          "min_lr must lie in [0, max_lr], got " + std::to_string(options_.min_lr));
  require(options_.init_lr >= 0.0, "init_lr must be >= 0, got " + std::to_string(options_.init_lr));
  require(options_.lr_warmup_steps >= 0, "lr_warmup_steps must be >= 0");
  require(options_.lr_decay_steps > 0, "lr_decay_steps must be > 0");
  require(options_.lr_warmup_steps < options_.lr_decay_steps || options_.lr_decay_style == LrDecayStyle::kConstant,
          "lr_warmup_steps (" + std::to_string(options_.lr_warmup_steps) + ") must be smaller than lr_decay_steps (" +
              std::to_string(options_.lr_decay_steps) + "), which count the warmup too");
  apply_lr();
}

double OptimizerParamScheduler::get_lr() const {
  const auto& o = options_;
  const double steps = static_cast<double>(num_steps_);
  if (o.lr_warmup_steps > 0 && num_steps_ <= o.lr_warmup_steps) {
    return o.init_lr + (o.max_lr - o.init_lr) * steps / static_cast<double>(o.lr_warmup_steps);
  }
  if (o.lr_decay_style == LrDecayStyle::kConstant) return o.max_lr;
  if (num_steps_ > o.lr_decay_steps) return o.min_lr;
  if (o.lr_decay_style == LrDecayStyle::kInverseSquareRoot) {
    const double warmup = static_cast<double>(std::max<std::int64_t>(o.lr_warmup_steps, 1));
    return std::max(o.min_lr, o.max_lr * std::sqrt(warmup) / std::sqrt(std::max(steps, 1.0)));
  }
  const double ratio =
      (steps - static_cast<double>(o.lr_warmup_steps)) / static_cast<double>(o.lr_decay_steps - o.lr_warmup_steps);
  const double coeff = o.lr_decay_style == LrDecayStyle::kLinear ? 1.0 - ratio : 0.5 * (std::cos(kPi * ratio) + 1.0);
  return o.min_lr + coeff * (o.max_lr - o.min_lr);
}

void OptimizerParamScheduler::step(std::int64_t increment) {
  if (increment < 0) throw std::invalid_argument("OptimizerParamScheduler::step: increment must be >= 0");
  num_steps_ += increment;
  apply_lr();
}

void OptimizerParamScheduler::set_num_steps(std::int64_t num_steps) {
  if (num_steps < 0) throw std::invalid_argument("OptimizerParamScheduler::set_num_steps: num_steps must be >= 0");
  num_steps_ = num_steps;
  apply_lr();
}

void OptimizerParamScheduler::apply_lr() {
  const double lr = get_lr();
  for (auto& group : optimizer_.param_groups()) group.options().set_lr(lr);
}

}  // namespace bridge::training
