// MetricMonitor: how the built-in stoppers and the divergence detector read the metric they watch.
//
// A name ending in " validation" is a validation loss, read at on_eval_end: "lm loss validation" is
// total_loss_dict["lm loss"], the tag Megatron writes to TensorBoard. Any other name is read at on_log from the
// record the metric writers get ("lm loss", "grad-norm", "learning-rate", "throughput/tokens_per_sec", ...). A value
// exists only where the loop has it (losses live on the last pipeline stage, where every data-parallel replica holds
// the same reduced value), so a decision is made there and reaches every rank through the control requests, which
// the loop agrees on across ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "training/callbacks/callback_context.h"
#include "training/callbacks/event.h"

namespace bridge::training {
inline namespace callbacks {

/// Which way a monitored metric improves.
enum class MonitorMode : std::uint8_t { kMin, kMax };

/// "min" or "max"; anything else throws std::invalid_argument naming `field` (e.g. "EarlyStopping.mode").
MonitorMode parse_monitor_mode(std::string_view text, std::string_view field);
std::string_view to_string(MonitorMode mode);

class MetricMonitor {
 public:
  /// Watches `name`; an empty name throws std::invalid_argument naming `field`.
  MetricMonitor(std::string name, std::string_view field);

  const std::string& name() const noexcept { return name_; }
  /// on_eval_end for a validation metric, on_log otherwise.
  Event event() const noexcept { return event_; }

  /// The metric's value at this event, or nothing: another event, or a rank that does not hold it. Where the metric
  /// should be (the last pipeline stage) but is not, warns once naming the metrics there are.
  std::optional<double> read(const CallbackContext& ctx);

  /// At on_train_start: warns (naming `owner`) when the run will never provide the metric: a validation metric with
  /// train.eval_interval or train.eval_iters at 0.
  void check_provided(const CallbackContext& ctx, std::string_view owner) const;

 private:
  std::string name_;
  std::string loss_key_;  // for a validation metric: the total_loss_dict key
  Event event_;
  bool warned_ = false;
};

}  // namespace callbacks
}  // namespace bridge::training
