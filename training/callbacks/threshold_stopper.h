// ThresholdStopper: stops training once a monitored metric is good enough (Composer's ThresholdStopper).
//
//   ThresholdStopperOptions options;
//   options.monitor = "lm loss validation";
//   options.threshold = 3.2;  // stop once the validation loss is below 3.2
//   manager->add(std::make_shared<ThresholdStopper>(options));
#pragma once

#include <optional>
#include <string>

#include "training/callbacks/callback.h"
#include "training/callbacks/metric_monitor.h"

namespace bridge::training {
inline namespace callbacks {

struct ThresholdStopperOptions {
  std::string monitor = "lm loss validation";  ///< see metric_monitor.h
  std::optional<double> threshold;             ///< required
  std::string mode = "min";  ///< "min": stop when the metric falls below threshold; "max": when it rises above
};

class ThresholdStopper : public Callback {
 public:
  /// Throws std::invalid_argument naming the option when one is invalid (a threshold that is not finite).
  explicit ThresholdStopper(ThresholdStopperOptions options);

  void on_train_start(CallbackContext& ctx) override;
  void on_log(CallbackContext& ctx) override;
  void on_eval_end(CallbackContext& ctx) override;
  void on_train_end(CallbackContext& ctx) override;

  const ThresholdStopperOptions& options() const noexcept { return options_; }

 private:
  void check(CallbackContext& ctx);

  ThresholdStopperOptions options_;
  MonitorMode mode_;
  MetricMonitor monitor_;
  bool training_over_ = false;  // the validation after training is not checked: nothing is left to stop
};

}  // namespace callbacks
}  // namespace bridge::training
