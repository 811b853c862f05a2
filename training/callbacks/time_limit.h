// TimeLimit: saves a checkpoint and stops training before a wall-clock budget runs out, e.g. a batch job's time
// allocation (Lightning's Timer, Megatron's exit_duration_in_mins with the save timed).
//
//   TimeLimitOptions options;
//   options.duration = std::chrono::hours(4);     // the job's allocation, counted from construction
//   options.reserve = std::chrono::minutes(5);    // kept free for what follows (final evaluation, upload)
//   manager->add(std::make_shared<TimeLimit>(options));
//
// After each step it predicts when the next step and a save would end (the longest step and save seen so far) and,
// when that would pass the budget less the reserve, asks for a save and a stop at this step. Every rank judges by
// its own clock; the loop acts when any rank asks, so all stop at the same step. Construct it first thing in main()
// so that start-up counts against the budget. With checkpoint.save unset the loop warns and only stops.
#pragma once

#include <chrono>

#include "training/callbacks/callback.h"

namespace bridge::training {
inline namespace callbacks {

struct TimeLimitOptions {
  std::chrono::milliseconds duration{0};  ///< the budget (> 0)
  std::chrono::milliseconds reserve{0};   ///< kept free at the end
};

class TimeLimit : public Callback {
 public:
  /// Starts the clock. Throws std::invalid_argument naming the option when one is out of range.
  explicit TimeLimit(TimeLimitOptions options);

  void on_train_step_start(CallbackContext& ctx) override;
  void on_train_step_end(CallbackContext& ctx) override;
  void on_checkpoint_save(CallbackContext& ctx) override;

  /// Seconds since construction.
  double elapsed_seconds() const;

 private:
  using Clock = std::chrono::steady_clock;

  TimeLimitOptions options_;
  Clock::time_point start_;
  Clock::time_point step_start_, step_end_;
  double longest_step_ = 0.0;  // seconds
  double longest_save_ = 0.0;  // seconds from a step's end to its checkpoint's on_checkpoint_save
  bool requested_ = false;
};

}  // namespace callbacks
}  // namespace bridge::training
