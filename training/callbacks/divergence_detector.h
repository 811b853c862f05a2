// DivergenceDetector: catches a loss that became NaN or infinite, or that spiked far above its recent values, and
// stops, aborts, or counts the spike and trains on (Forgather's DivergenceDetector, Lightning's SpikeDetection).
//
//   DivergenceDetectorOptions options;
//   options.monitor = "lm loss";  // the training loss at each log step
//   options.spike_factor = 2.0;   // a value above twice the mean of the last `window` values is a spike
//   options.action = "abort";     // pretrain() fails with the reason
//   manager->add(std::make_shared<DivergenceDetector>(options));
//
// A NaN or infinite value acts at once. A finite value is judged once `warmup` values are in the window: it is a
// spike when above spike_factor x the window's mean, or above the mean + absolute_threshold when that is set.
// `patience` consecutive spikes act: "stop" and "abort" request that of the loop; "skip" counts the spike (logged as
// divergence/spikes) and trains on. Spikes never enter the window, so a run of them is measured against the values
// before it. The window and the counts are saved in checkpoints.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "training/callbacks/callback.h"
#include "training/callbacks/metric_monitor.h"

namespace bridge::training {
inline namespace callbacks {

struct DivergenceDetectorOptions {
  std::string monitor = "lm loss";           ///< see metric_monitor.h; a metric that should fall (a loss)
  std::int64_t window = 20;                  ///< recent values a spike is measured against
  std::int64_t warmup = 5;                   ///< values in the window before spikes are judged (NaN/inf always are)
  double spike_factor = 2.0;                 ///< a spike: above this many times the window's mean (> 1)
  std::optional<double> absolute_threshold;  ///< also a spike: above the window's mean by this much
  std::int64_t patience = 1;                 ///< consecutive spikes before acting
  std::string action = "stop";               ///< "stop", "abort" or "skip" (count and train on)
};

class DivergenceDetector : public Callback {
 public:
  enum class Action : std::uint8_t { kStop, kAbort, kSkip };

  /// Throws std::invalid_argument naming the option (e.g. "DivergenceDetector.action") when one is invalid.
  explicit DivergenceDetector(DivergenceDetectorOptions options = {});

  std::string state_key() const override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  void on_log(CallbackContext& ctx) override;
  void on_eval_end(CallbackContext& ctx) override;

  const DivergenceDetectorOptions& options() const noexcept { return options_; }
  /// Spikes and non-finite values seen so far.
  std::int64_t spikes() const noexcept { return spikes_; }

 private:
  void observe(CallbackContext& ctx, double value);

  DivergenceDetectorOptions options_;
  Action action_;
  MetricMonitor monitor_;
  std::deque<double> window_;
  double window_sum_ = 0.0;
  std::int64_t consecutive_ = 0;
  std::int64_t spikes_ = 0;
};

}  // namespace callbacks
}  // namespace bridge::training
