// EarlyStopping: Lightning's order of checks over a monitored metric.
#include "training/callbacks/early_stopping.h"

#include <cmath>
#include <stdexcept>

#include "utils/logging.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

std::string number(double value) { return fmt::format("{:.6g}", value); }

}  // namespace

EarlyStopping::EarlyStopping(EarlyStoppingOptions options)
    : options_(std::move(options)),
      mode_(parse_monitor_mode(options_.mode, "EarlyStopping.mode")),
      monitor_(options_.monitor, "EarlyStopping.monitor"),
      best_(mode_ == MonitorMode::kMin ? std::numeric_limits<double>::infinity()
                                       : -std::numeric_limits<double>::infinity()) {
  if (options_.patience < 1) {
    throw std::invalid_argument("EarlyStopping.patience is " + std::to_string(options_.patience) +
                                "; it counts checks without improvement before stopping: use 1 or more");
  }
  if (!(options_.min_delta >= 0.0) || !std::isfinite(options_.min_delta)) {
    throw std::invalid_argument("EarlyStopping.min_delta is " + number(options_.min_delta) +
                                "; use a finite value >= 0 (how much better than the best a value must be)");
  }
}

std::string EarlyStopping::state_key() const {
  // With the monitor and mode, as Lightning's key: two stoppers on different metrics keep separate states.
  return "EarlyStopping{monitor=" + options_.monitor + ", mode=" + options_.mode + "}";
}

StateDict EarlyStopping::state_dict() const {
  return {{"best", best_}, {"wait", wait_}, {"best_step", best_step_}, {"patience", options_.patience}};
}

void EarlyStopping::load_state_dict(const StateDict& state) {
  best_ = state.at("best").toDouble();
  wait_ = state.at("wait").toInt();
  best_step_ = state.at("best_step").toInt();
}

void EarlyStopping::on_train_start(CallbackContext& ctx) {
  training_over_ = false;
  monitor_.check_provided(ctx, "EarlyStopping");
}

void EarlyStopping::on_train_end(CallbackContext&) { training_over_ = true; }

void EarlyStopping::on_log(CallbackContext& ctx) {
  if (const std::optional<double> value = monitor_.read(ctx)) check(ctx, *value);
  if (std::isfinite(best_)) {
    ctx.log->metrics["early_stopping/best"] = best_;
    ctx.log->metrics["early_stopping/wait"] = static_cast<double>(wait_);
  }
}

void EarlyStopping::on_eval_end(CallbackContext& ctx) {
  if (training_over_) return;
  if (const std::optional<double> value = monitor_.read(ctx)) check(ctx, *value);
}

void EarlyStopping::check(CallbackContext& ctx, double value) {
  const std::int64_t step = ctx.state.train_state.step;
  const std::string& name = options_.monitor;
  const bool minimize = mode_ == MonitorMode::kMin;
  const auto better = [minimize](double a, double b) { return minimize ? a < b : a > b; };
  if (options_.check_finite && !std::isfinite(value)) {
    ctx.request_stop(name + " is " + number(value) + " at step " + std::to_string(step) + "; the best was " +
                     number(best_));
    return;
  }
  if (options_.stopping_threshold && better(value, *options_.stopping_threshold)) {
    ctx.request_stop(name + " = " + number(value) + " passed the stopping threshold " +
                     number(*options_.stopping_threshold) + " at step " + std::to_string(step));
    return;
  }
  if (options_.divergence_threshold && better(*options_.divergence_threshold, value)) {
    ctx.request_stop(name + " = " + number(value) + " is " + (minimize ? "above" : "below") +
                     " the divergence threshold " + number(*options_.divergence_threshold) + " at step " +
                     std::to_string(step));
    return;
  }
  const double target = minimize ? best_ - options_.min_delta : best_ + options_.min_delta;
  if (better(value, target)) {
    best_ = value;
    best_step_ = step;
    wait_ = 0;
    return;
  }
  ++wait_;
  if (wait_ >= options_.patience) {
    ctx.request_stop(name + " did not improve by more than " + number(options_.min_delta) + " in " +
                     std::to_string(wait_) + " checks; the best was " + number(best_) + " at step " +
                     std::to_string(best_step_));
  }
}

}  // namespace callbacks
}  // namespace bridge::training
