// DivergenceDetector: a window of accepted values, and the spikes judged against its mean.
#include "training/callbacks/divergence_detector.h"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "utils/logging.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

DivergenceDetector::Action parse_action(const std::string& text) {
  if (text == "stop") return DivergenceDetector::Action::kStop;
  if (text == "abort") return DivergenceDetector::Action::kAbort;
  if (text == "skip") return DivergenceDetector::Action::kSkip;
  throw std::invalid_argument("DivergenceDetector.action is '" + text +
                              "'; use 'stop' (finish the step and end training), 'abort' (pretrain() fails) or "
                              "'skip' (count the spike and train on)");
}

}  // namespace

DivergenceDetector::DivergenceDetector(DivergenceDetectorOptions options)
    : options_(std::move(options)),
      action_(parse_action(options_.action)),
      monitor_(options_.monitor, "DivergenceDetector.monitor") {
  const auto require = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("DivergenceDetector." + what);
  };
  require(options_.window >= 1, "window is " + std::to_string(options_.window) + "; use 1 or more values");
  require(options_.warmup >= 1 && options_.warmup <= options_.window, "warmup is " + std::to_string(options_.warmup) +
                                                                          "; use 1 to window (" +
                                                                          std::to_string(options_.window) + ") values");
  require(
      options_.spike_factor > 1.0 && std::isfinite(options_.spike_factor),
      fmt::format("spike_factor is {:.6g}; use a finite factor above 1 (2.0: a spike is over twice the recent mean)",
                  options_.spike_factor));
  require(!options_.absolute_threshold ||
              (*options_.absolute_threshold > 0.0 && std::isfinite(*options_.absolute_threshold)),
          fmt::format("absolute_threshold is {:.6g}; use a finite value above 0, or leave it unset",
                      options_.absolute_threshold.value_or(0.0)));
  require(options_.patience >= 1, "patience is " + std::to_string(options_.patience) + "; use 1 or more spikes");
}

std::string DivergenceDetector::state_key() const { return "DivergenceDetector{monitor=" + options_.monitor + "}"; }

StateDict DivergenceDetector::state_dict() const {
  return {{"window", std::vector<double>(window_.begin(), window_.end())},
          {"consecutive", consecutive_},
          {"spikes", spikes_}};
}

void DivergenceDetector::load_state_dict(const StateDict& state) {
  const std::vector<double> values = state.at("window").toDoubleVector();
  window_.assign(values.begin(), values.end());
  while (static_cast<std::int64_t>(window_.size()) > options_.window) window_.pop_front();  // a smaller window now
  window_sum_ = 0.0;
  for (const double value : window_) window_sum_ += value;
  consecutive_ = state.at("consecutive").toInt();
  spikes_ = state.at("spikes").toInt();
}

void DivergenceDetector::on_log(CallbackContext& ctx) {
  if (const std::optional<double> value = monitor_.read(ctx)) observe(ctx, *value);
  if (!window_.empty()) {
    ctx.log->metrics["divergence/spikes"] = static_cast<double>(spikes_);
    ctx.log->metrics["divergence/window_mean"] = window_sum_ / static_cast<double>(window_.size());
  }
}

void DivergenceDetector::on_eval_end(CallbackContext& ctx) {
  if (const std::optional<double> value = monitor_.read(ctx)) observe(ctx, *value);
}

void DivergenceDetector::observe(CallbackContext& ctx, double value) {
  const std::int64_t step = ctx.state.train_state.step;
  const bool finite = std::isfinite(value);
  const double mean = window_.empty() ? 0.0 : window_sum_ / static_cast<double>(window_.size());
  const bool judged = static_cast<std::int64_t>(window_.size()) >= options_.warmup;
  const bool spike =
      !finite || (judged && (value > options_.spike_factor * mean ||
                             (options_.absolute_threshold && value > mean + *options_.absolute_threshold)));
  if (!spike) {
    consecutive_ = 0;
    window_.push_back(value);
    window_sum_ += value;
    if (static_cast<std::int64_t>(window_.size()) > options_.window) {
      window_sum_ -= window_.front();
      window_.pop_front();
    }
    return;
  }
  ++spikes_;
  ++consecutive_;
  const std::string what = finite
                               ? fmt::format("{} = {:.6g} at step {} is {:.3g}x the mean {:.6g} of the last {} values",
                                             options_.monitor, value, step, value / mean, mean, window_.size())
                               : fmt::format("{} is {} at step {}", options_.monitor, value, step);
  if (finite && consecutive_ < options_.patience) {
    bridge::utils::logger().warn("divergence detector: {} (spike {} of {} before acting)", what, consecutive_,
                                 options_.patience);
    return;
  }
  switch (action_) {
    case Action::kStop:
      ctx.request_stop("diverged: " + what);
      break;
    case Action::kAbort:
      ctx.request_abort("diverged: " + what);
      break;
    case Action::kSkip:
      bridge::utils::logger().warn("divergence detector: {}; training on (spike {} in all)", what, spikes_);
      break;
  }
}

}  // namespace callbacks
}  // namespace bridge::training
