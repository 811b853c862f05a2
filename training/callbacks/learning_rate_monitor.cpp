// LearningRateMonitor: reads the optimizer's parameter groups at each log step.
#include "training/callbacks/learning_rate_monitor.h"

#include <optional>
#include <string>
#include <typeinfo>

#include "utils/type_name.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

// Adam's beta1 or SGD's momentum, and the weight decay, of the optimizers bridge builds (FusedAdamW uses AdamW's).
std::optional<double> momentum_of(const torch::optim::OptimizerOptions& options) {
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) return std::get<0>(adamw->betas());
  if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&options)) return std::get<0>(adam->betas());
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&options)) return sgd->momentum();
  return std::nullopt;
}

std::optional<double> weight_decay_of(const torch::optim::OptimizerOptions& options) {
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) return adamw->weight_decay();
  if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&options)) return adam->weight_decay();
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&options)) return sgd->weight_decay();
  return std::nullopt;
}

}  // namespace

void LearningRateMonitor::on_log(CallbackContext& ctx) {
  torch::optim::Optimizer& optimizer = *ctx.optimizer;
  const std::string name = bridge::utils::short_type_name(typeid(optimizer));
  auto& metrics = ctx.log->metrics;
  const auto& groups = optimizer.param_groups();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const std::string suffix = name + "/pg" + std::to_string(i);
    const torch::optim::OptimizerOptions& options = groups[i].options();
    metrics["lr-" + suffix] = options.get_lr();
    if (options_.log_momentum) {
      if (const auto momentum = momentum_of(options)) metrics["momentum-" + suffix] = *momentum;
    }
    if (options_.log_weight_decay) {
      if (const auto decay = weight_decay_of(options)) metrics["weight_decay-" + suffix] = *decay;
    }
  }
}

}  // namespace callbacks
}  // namespace bridge::training
