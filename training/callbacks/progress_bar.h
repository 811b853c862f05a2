// ProgressBar: a live bar on the rank that prints the log (the last), like Lightning's TQDMProgressBar.
//
//   manager->add(std::make_shared<ProgressBar>());
//
//   step 40/100 [############------------------]  40% | loss 5.1230 | 1.2k tokens/s | ETA 0:01:23
//
// On a terminal the bar is redrawn in place after each step (at most every refresh_seconds) and cleared before each
// log line; into a file or pipe it prints a plain line every line_seconds. The loss is the last logged "lm loss";
// tokens/s and the ETA come from the steps since training started (less evaluation), so the bar needs no other
// callback and no collective.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "training/callbacks/callback.h"

namespace bridge::training {
inline namespace callbacks {

struct ProgressBarOptions {
  int width = 30;                ///< characters of the bar itself
  double refresh_seconds = 0.1;  ///< on a terminal: the least time between redraws
  double line_seconds = 30.0;    ///< not on a terminal: the least time between lines
  std::string loss = "lm loss";  ///< the logged metric shown as the loss
  std::FILE* stream = nullptr;   ///< where to draw; null: stdout
  std::optional<bool> terminal;  ///< whether `stream` is a terminal; unset: asked of the stream (isatty)
};

class ProgressBar : public Callback {
 public:
  explicit ProgressBar(ProgressBarOptions options = {});

  void on_train_start(CallbackContext& ctx) override;
  void on_train_step_end(CallbackContext& ctx) override;
  void on_eval_start(CallbackContext& ctx) override;
  void on_eval_end(CallbackContext& ctx) override;
  void on_log(CallbackContext& ctx) override;
  void on_train_end(CallbackContext& ctx) override;

  /// The bar for `steps_done` of `total` steps (for tests and custom output).
  std::string render(std::int64_t steps_done, std::int64_t total) const;

 private:
  using Clock = std::chrono::steady_clock;
  void draw(bool final);
  double train_seconds() const;

  ProgressBarOptions options_;
  bool active_ = false;  // this rank draws
  bool terminal_ = false;
  std::int64_t start_step_ = 0, step_ = 0, total_ = 0;
  double tokens_per_step_ = 0.0;
  std::optional<double> loss_;
  Clock::time_point start_, last_draw_, eval_start_;
  Clock::duration paused_{};
  bool drawn_ = false;  // a bar is on the terminal's current line
};

}  // namespace callbacks
}  // namespace bridge::training
