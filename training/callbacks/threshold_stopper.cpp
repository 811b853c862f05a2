// ThresholdStopper: one comparison per check.
#include "training/callbacks/threshold_stopper.h"

#include <cmath>
#include <stdexcept>

#include "utils/logging.h"

namespace bridge::training {
inline namespace callbacks {

ThresholdStopper::ThresholdStopper(ThresholdStopperOptions options)
    : options_(std::move(options)),
      mode_(parse_monitor_mode(options_.mode, "ThresholdStopper.mode")),
      monitor_(options_.monitor, "ThresholdStopper.monitor") {
  if (!options_.threshold) {
    throw std::invalid_argument("ThresholdStopper.threshold is not set; give the value at which training should stop");
  }
  if (!std::isfinite(*options_.threshold)) {
    throw std::invalid_argument(
        fmt::format("ThresholdStopper.threshold is {:.6g}; use the finite value at which training should stop",
                    *options_.threshold));
  }
}

void ThresholdStopper::on_train_start(CallbackContext& ctx) {
  training_over_ = false;
  monitor_.check_provided(ctx, "ThresholdStopper");
}
void ThresholdStopper::on_log(CallbackContext& ctx) { check(ctx); }
void ThresholdStopper::on_eval_end(CallbackContext& ctx) {
  if (!training_over_) check(ctx);
}
void ThresholdStopper::on_train_end(CallbackContext&) { training_over_ = true; }

void ThresholdStopper::check(CallbackContext& ctx) {
  const std::optional<double> value = monitor_.read(ctx);
  if (!value) return;
  const double threshold = *options_.threshold;
  const bool reached = mode_ == MonitorMode::kMin ? *value < threshold : *value > threshold;
  if (!reached) return;
  ctx.request_stop(fmt::format("{} = {:.6g} is {} the threshold {:.6g} at step {}", options_.monitor, *value,
                               mode_ == MonitorMode::kMin ? "below" : "above", threshold, ctx.state.train_state.step));
}

}  // namespace callbacks
}  // namespace bridge::training
