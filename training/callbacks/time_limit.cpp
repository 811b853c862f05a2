// TimeLimit: the next step and save predicted from the longest seen, against the budget.
#include "training/callbacks/time_limit.h"

#include <algorithm>
#include <stdexcept>

#include "utils/logging.h"
#include "utils/strings.h"

namespace bridge::training {
inline namespace callbacks {

TimeLimit::TimeLimit(TimeLimitOptions options) : options_(options), start_(Clock::now()) {
  if (options_.duration.count() <= 0) {
    throw std::invalid_argument("TimeLimit.duration is " + std::to_string(options_.duration.count()) +
                                " ms; give the wall-clock budget, e.g. duration: 4h");
  }
  if (options_.reserve.count() < 0 || options_.reserve >= options_.duration) {
    throw std::invalid_argument("TimeLimit.reserve is " + std::to_string(options_.reserve.count()) +
                                " ms; use 0 or more and less than TimeLimit.duration (" +
                                std::to_string(options_.duration.count()) + " ms)");
  }
}

double TimeLimit::elapsed_seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

void TimeLimit::on_train_step_start(CallbackContext&) { step_start_ = Clock::now(); }

void TimeLimit::on_train_step_end(CallbackContext& ctx) {
  step_end_ = Clock::now();
  longest_step_ = std::max(longest_step_, std::chrono::duration<double>(step_end_ - step_start_).count());
  if (requested_) return;
  const double budget = std::chrono::duration<double>(options_.duration - options_.reserve).count();
  const double elapsed = elapsed_seconds();
  if (elapsed + longest_step_ + longest_save_ <= budget) return;
  requested_ = true;
  const std::string reason =
      fmt::format("{} of the {} time limit used{}; the next step ({:.1f} s) and a save ({:.1f} s) would not fit",
                  bridge::utils::format_duration(elapsed),
                  bridge::utils::format_duration(std::chrono::duration<double>(options_.duration).count()),
                  options_.reserve.count() > 0
                      ? " (" + bridge::utils::format_duration(std::chrono::duration<double>(options_.reserve).count()) +
                            " reserved)"
                      : "",
                  longest_step_, longest_save_);
  ctx.request_save(reason);
  ctx.request_stop(reason);
}

void TimeLimit::on_checkpoint_save(CallbackContext&) {
  // From the step's end: the log line and an evaluation at the same step count too, as they would then.
  longest_save_ = std::max(longest_save_, std::chrono::duration<double>(Clock::now() - step_end_).count());
}

}  // namespace callbacks
}  // namespace bridge::training
