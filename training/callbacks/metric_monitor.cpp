// MetricMonitor: a metric by name from the log record or the validation losses.
#include "training/callbacks/metric_monitor.h"

#include <stdexcept>
#include <vector>

#include "parallel/parallel_state.h"
#include "training/config/config.h"
#include "utils/closest_match.h"
#include "utils/logging.h"
#include "utils/strings.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

constexpr std::string_view kValidationSuffix = " validation";

// Whether this rank holds the losses: the last pipeline stage (any rank outside a parallel job).
bool holds_losses() {
  return !parallel::model_parallel_is_initialized() || parallel::is_pipeline_last_stage(/*ignore_virtual=*/true);
}

}  // namespace

MonitorMode parse_monitor_mode(std::string_view text, std::string_view field) {
  if (text == "min") return MonitorMode::kMin;
  if (text == "max") return MonitorMode::kMax;
  throw std::invalid_argument(std::string(field) + " is '" + std::string(text) +
                              "'; use 'min' (the metric improves as it falls, as losses do) or 'max'");
}

std::string_view to_string(MonitorMode mode) { return mode == MonitorMode::kMin ? "min" : "max"; }

MetricMonitor::MetricMonitor(std::string name, std::string_view field) : name_(std::move(name)) {
  if (name_.empty()) {
    throw std::invalid_argument(std::string(field) +
                                " is empty; name the metric to watch, e.g. 'lm loss validation' (the validation "
                                "loss) or 'lm loss' (the training loss at each log step)");
  }
  const bool validation = name_.size() > kValidationSuffix.size() &&
                          std::string_view(name_).substr(name_.size() - kValidationSuffix.size()) == kValidationSuffix;
  event_ = validation ? Event::kEvalEnd : Event::kLog;
  if (validation) loss_key_ = name_.substr(0, name_.size() - kValidationSuffix.size());
}

void MetricMonitor::check_provided(const CallbackContext& ctx, std::string_view owner) const {
  if (event_ != Event::kEvalEnd || ctx.state.cfg == nullptr) return;
  const TrainingConfig& train = ctx.state.cfg->train;
  if (train.eval_interval > 0 && train.eval_iters > 0) return;
  bridge::utils::logger().warn(
      "{} monitors '{}', a validation loss, but train.eval_interval is {} and train.eval_iters {}: no evaluation "
      "runs during training, so it never checks; set both above 0",
      owner, name_, train.eval_interval, train.eval_iters);
}

std::optional<double> MetricMonitor::read(const CallbackContext& ctx) {
  if (ctx.event() != event_) return std::nullopt;
  std::vector<std::string> available;
  if (event_ == Event::kEvalEnd) {
    const LossDict& losses = *ctx.total_loss_dict;
    if (losses.empty()) return std::nullopt;  // not the last pipeline stage
    if (const auto it = losses.find(loss_key_); it != losses.end()) return it->second.item<double>();
    for (const auto& entry : losses) available.push_back(entry.first + std::string(kValidationSuffix));
  } else {
    const auto& metrics = ctx.log->metrics;
    if (const auto it = metrics.find(name_); it != metrics.end()) return it->second;
    if (!holds_losses()) return std::nullopt;
    for (const auto& entry : metrics) available.push_back(entry.first);
  }
  if (!warned_) {
    warned_ = true;
    const std::vector<std::string_view> candidates(available.begin(), available.end());
    const std::optional<std::string> closest = bridge::utils::closest_match(name_, candidates);
    bridge::utils::logger().warn("the monitored metric '{}' is not among {} at {}{}; they are: {}", name_,
                                 event_ == Event::kEvalEnd ? "the validation losses" : "the logged metrics",
                                 to_string(event_), closest ? " (did you mean '" + *closest + "'?)" : "",
                                 bridge::utils::join(available, ", "));
  }
  return std::nullopt;
}

}  // namespace callbacks
}  // namespace bridge::training
