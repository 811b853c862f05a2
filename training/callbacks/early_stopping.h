// EarlyStopping: stops training when a monitored metric stops improving (Lightning's EarlyStopping, Composer's
// EarlyStopper).
//
//   EarlyStoppingOptions options;
//   options.monitor = "lm loss validation";  // checked at every evaluation
//   options.patience = 3;                    // evaluations without an improvement of more than min_delta
//   manager->add(std::make_shared<EarlyStopping>(options));
//
// Each check, in Lightning's order: a value that is not finite stops (check_finite); a value better than
// stopping_threshold stops; one worse than divergence_threshold stops; an improvement (below best - min_delta for
// "min", above best + min_delta for "max") resets the wait; otherwise the wait grows, and reaching patience stops.
// Patience counts checks (evaluations, or log steps for a training metric), not steps. The stop lets the step finish
// and save as a requested stop does; the best value and the wait are saved in checkpoints, so a resumed run keeps
// counting. The validation after training is not checked: nothing is left to stop.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "training/callbacks/callback.h"
#include "training/callbacks/metric_monitor.h"

namespace bridge::training {
inline namespace callbacks {

struct EarlyStoppingOptions {
  std::string monitor = "lm loss validation";  ///< see metric_monitor.h
  double min_delta = 0.0;                      ///< an improvement must beat the best by more than this
  std::int64_t patience = 3;                   ///< checks without improvement before stopping
  std::string mode = "min";                    ///< "min": lower is better; "max": higher is better
  bool check_finite = true;                    ///< stop on NaN or infinity
  std::optional<double> stopping_threshold;    ///< stop once the metric is this good
  std::optional<double> divergence_threshold;  ///< stop once the metric is this bad
};

class EarlyStopping : public Callback {
 public:
  /// Throws std::invalid_argument naming the option (e.g. "EarlyStopping.patience") when one is out of range.
  explicit EarlyStopping(EarlyStoppingOptions options = {});

  std::string state_key() const override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  void on_train_start(CallbackContext& ctx) override;
  void on_log(CallbackContext& ctx) override;
  void on_eval_end(CallbackContext& ctx) override;
  void on_train_end(CallbackContext& ctx) override;

  const EarlyStoppingOptions& options() const noexcept { return options_; }
  /// The best value seen (+inf for "min", -inf for "max" before the first check).
  double best() const noexcept { return best_; }
  /// Checks since the last improvement.
  std::int64_t wait() const noexcept { return wait_; }

 private:
  void check(CallbackContext& ctx, double value);

  EarlyStoppingOptions options_;
  MonitorMode mode_;
  MetricMonitor monitor_;
  double best_;
  std::int64_t wait_ = 0;
  std::int64_t best_step_ = -1;
  // From on_train_end to the next on_train_start: the validation after training is not checked, as there is no
  // training left to stop (it would only repeat the stop's reason in the log).
  bool training_over_ = false;
};

}  // namespace callbacks
}  // namespace bridge::training
