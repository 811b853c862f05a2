// TrainingLogger: what pretrain() does after each step to log it (Megatron-Bridge's training_log as the loop calls
// it). Every rank accumulates the losses; at a log step (every logging.log_interval steps and the run's first step
// for the console, logging.tensorboard_log_interval for the writers) all ranks share their statistics and the
// pending control requests in ONE collective, fire on_log, and the last rank prints Megatron's line, with the time
// elapsed and the ETA, and writes the metrics. Only the last rank's on_log text reaches the console line, and only
// its metrics the writers.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "training/callbacks/callback_context.h"
#include "training/callbacks/control_sync.h"
#include "training/utils/training_log.h"
#include "utils/metric_writer.h"

namespace bridge::training {

struct PretrainSetup;

/// What a log step agreed on, for the loop's step boundary.
struct LoggedStep {
  /// The control requests made on any rank up to this point of the step.
  AgreedControl control;
  /// Whether some rank has on_log callbacks, which may have made requests after the collective.
  bool on_log_fired = false;
};

class TrainingLogger {
 public:
  /// Opens the metric writers (logging.tensorboard_dir, logging.jsonl_path) on the last rank.
  explicit TrainingLogger(PretrainSetup& setup);

  /// Starts the clocks (call when training starts).
  void start();

  /// After step `train_state.step` (already counted): accumulates its losses and, at a log step, gathers the
  /// statistics (one collective on every rank), fires on_log, prints the line and writes the metrics. Returns what
  /// the collective agreed at a log step, nothing otherwise.
  std::optional<LoggedStep> after_step(const LossDict& loss_dict, double grad_norm, bool skipped_iter);

  /// On the writer rank, writes an evaluation's losses as Megatron does: `<key> validation` (and `<key> validation
  /// ppl` with logging.log_validation_ppl_to_tensorboard) at the step, the `... vs samples` curves in TensorBoard.
  /// A test writes `<key> test` alike: Megatron writes its test losses under the validation tags, where they would
  /// land on the final validation's point. A failure is logged and fails the next log step.
  void write_evaluation(const LossDict& total, bool is_test);

  /// Flushes the writers (at the end of training; the writers also flush after every write). A failure is logged,
  /// not thrown: the other ranks could not learn of it.
  void flush();

 private:
  void write(const LogRecord& record, const LossDict& loss_dict, int64_t iteration);
  /// Runs `writes` and flushes; a failure is logged, the writers closed and the error kept for the next log step.
  void write_guarded(const char* what, int64_t iteration, const std::function<void()>& writes);
  bool is_console_step(int64_t iteration) const;
  bool is_writer_step(int64_t iteration) const;
  double seconds_since_start() const;
  /// The time left after step `iteration`, done `now` seconds after the start; nothing without train.train_iters.
  std::optional<double> eta_seconds(int64_t iteration, double now) const;

  PretrainSetup& setup_;
  bool writer_rank_ = false;
  std::shared_ptr<bridge::utils::MetricWriter> writer_;       // every metric (TensorBoard and JSONL)
  std::shared_ptr<bridge::utils::MetricWriter> tensorboard_;  // also the "X vs samples" variants
  utils::TotalLossDict total_loss_dict_;
  std::chrono::steady_clock::time_point start_, interval_start_;
  double start_wall_ = 0.0;
  std::deque<double> history_wct_;   // seconds since start at the end of each recent step
  double first_step_seconds_ = 0.0;  // seconds since start at the end of the run's first step
  double flops_per_step_ = 0.0;
  double flops_at_last_log_ = 0.0;
  bool report_memory_flag_ = true;
  int64_t loaded_iteration_ = 0;              // the step training started from
  std::vector<std::string> grad_norm_names_;  // the whole model's parameter names, gathered once
  std::string writer_error_;                  // a write that failed on this rank, shared at the next log step
};

}  // namespace bridge::training
