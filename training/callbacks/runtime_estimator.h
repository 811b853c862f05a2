// RuntimeEstimator: the time left until training ends (Composer's RuntimeEstimator).
//
//   manager->add(std::make_shared<RuntimeEstimator>());
//
// At each log step: "time/remaining_estimate" in the record (in `time_unit`) and its estimate in seconds as the
// record's eta_seconds, which the console line shows as "ETA: H:MM:SS" (in place of the loop's cruder one). The
// estimate is the mean training step time so far, less evaluation, times the steps left, plus the mean evaluation time
// times the evaluations left (train.eval_interval). The first `skip_steps` steps (start-up, warm caches) are not
// counted; nothing is reported until one step after them.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "training/callbacks/callback.h"

namespace bridge::training {
inline namespace callbacks {

struct RuntimeEstimatorOptions {
  std::int64_t skip_steps = 1;  ///< steps left out of the mean at the start
  /// Of time/remaining_estimate: seconds, minutes, hours or days; empty: logging.runtime_time_unit, the unit of the
  /// loop's own estimate under the same name (logging.log_runtime_to_tensorboard), which this one replaces.
  std::string time_unit;
};

class RuntimeEstimator : public Callback {
 public:
  /// Throws std::invalid_argument naming the option when one is invalid.
  explicit RuntimeEstimator(RuntimeEstimatorOptions options = {});

  void on_train_start(CallbackContext& ctx) override;
  void on_train_step_end(CallbackContext& ctx) override;
  void on_eval_start(CallbackContext& ctx) override;
  void on_eval_end(CallbackContext& ctx) override;
  void on_log(CallbackContext& ctx) override;
  void on_train_end(CallbackContext& ctx) override;

  /// Seconds left as estimated now, or nothing before the first counted step.
  std::optional<double> remaining_seconds(const CallbackContext& ctx) const;

 private:
  using Clock = std::chrono::steady_clock;

  RuntimeEstimatorOptions options_;
  std::optional<double> unit_seconds_;  // from the options, or at on_train_start from the config
  std::int64_t start_step_ = 0;
  std::optional<std::int64_t> clock_step_;  // the step count when the clock started
  Clock::time_point clock_start_;
  double eval_seconds_since_clock_ = 0.0;  // evaluation time inside the clock's span
  double eval_seconds_total_ = 0.0;
  std::int64_t evals_ = 0;
  Clock::time_point eval_start_;
  bool training_ = false;
};

}  // namespace callbacks
}  // namespace bridge::training
