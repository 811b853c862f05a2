// RuntimeEstimator: step and evaluation times measured, the rest extrapolated.
#include "training/callbacks/runtime_estimator.h"

#include <algorithm>
#include <stdexcept>

#include "training/config/config.h"
#include "training/utils/train_utils.h"

namespace bridge::training {
inline namespace callbacks {

RuntimeEstimator::RuntimeEstimator(RuntimeEstimatorOptions options) : options_(std::move(options)) {
  if (options_.skip_steps < 0) {
    throw std::invalid_argument("RuntimeEstimator.skip_steps is " + std::to_string(options_.skip_steps) +
                                "; use 0 or more");
  }
  if (options_.time_unit.empty()) return;  // the config's, at on_train_start
  unit_seconds_ = utils::seconds_per_time_unit(options_.time_unit);
  if (!unit_seconds_) {
    throw std::invalid_argument("RuntimeEstimator.time_unit is '" + options_.time_unit +
                                "'; use seconds, minutes, hours or days (or leave it out for "
                                "logging.runtime_time_unit)");
  }
}

void RuntimeEstimator::on_train_start(CallbackContext& ctx) {
  if (options_.time_unit.empty()) {
    const std::string unit = ctx.state.cfg != nullptr ? ctx.state.cfg->logging.runtime_time_unit : "hours";
    unit_seconds_ = utils::seconds_per_time_unit(unit).value_or(3600.0);
  }
  start_step_ = ctx.state.train_state.step;
  clock_step_.reset();
  eval_seconds_since_clock_ = eval_seconds_total_ = 0.0;
  evals_ = 0;
  training_ = true;
  if (options_.skip_steps == 0) {
    clock_step_ = start_step_;
    clock_start_ = Clock::now();
  }
}

void RuntimeEstimator::on_train_step_end(CallbackContext& ctx) {
  // The step's iteration number is the steps done once it is counted.
  if (!clock_step_ && ctx.iteration() - start_step_ >= options_.skip_steps) {
    clock_step_ = ctx.iteration();
    clock_start_ = Clock::now();
  }
}

void RuntimeEstimator::on_train_end(CallbackContext&) { training_ = false; }

void RuntimeEstimator::on_eval_start(CallbackContext&) { eval_start_ = Clock::now(); }

void RuntimeEstimator::on_eval_end(CallbackContext&) {
  if (!training_) return;
  const double seconds = std::chrono::duration<double>(Clock::now() - eval_start_).count();
  eval_seconds_total_ += seconds;
  ++evals_;
  if (clock_step_) eval_seconds_since_clock_ += seconds;
}

std::optional<double> RuntimeEstimator::remaining_seconds(const CallbackContext& ctx) const {
  if (!clock_step_ || ctx.state.cfg == nullptr) return std::nullopt;
  const TrainState& train_state = ctx.state.train_state;
  const std::int64_t done = train_state.step - *clock_step_;
  if (done <= 0) return std::nullopt;
  const TrainingConfig& train = ctx.state.cfg->train;
  const double elapsed = std::chrono::duration<double>(Clock::now() - clock_start_).count();
  const double per_step = std::max(0.0, elapsed - eval_seconds_since_clock_) / static_cast<double>(done);
  const std::int64_t steps_left = std::max<std::int64_t>(0, train.train_iters - train_state.step);
  double remaining = per_step * static_cast<double>(steps_left);
  if (train_state.do_valid && train.eval_interval > 0 && evals_ > 0) {
    const std::int64_t evals_left = train.train_iters / train.eval_interval - train_state.step / train.eval_interval;
    remaining += eval_seconds_total_ / static_cast<double>(evals_) * static_cast<double>(evals_left);
  }
  return remaining;
}

void RuntimeEstimator::on_log(CallbackContext& ctx) {
  const std::optional<double> remaining = remaining_seconds(ctx);
  if (!remaining) return;
  ctx.log->metrics["time/remaining_estimate"] = *remaining / unit_seconds_.value_or(3600.0);
  ctx.log->eta_seconds = *remaining;  // the line's (and ControlEndpoint's) ETA: this one leaves evaluation out
}

}  // namespace callbacks
}  // namespace bridge::training
