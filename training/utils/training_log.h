// The training log (the pure part of Megatron-Bridge's training_log): losses accumulated between console lines with
// the advanced/skipped/NaN counters, and Megatron's console line. The loop (training/training_logger.cpp) gathers the
// statistics, fires on_log and writes the metrics; this file only counts and formats, so tests can pin every field.
//
//    [2026-11-22 10:00:00] iteration       20/     100 | consumed samples:          640 | elapsed time per
//    iteration (ms): 812.3 | elapsed: 0:00:17 | ETA: 0:01:05 | learning rate: 3.000000E-04 | global batch size:
//    32 | losses averaged over: 10 steps | lm loss: 5.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | number of
//    skipped iterations:   0 | number of nan iterations:   0 |
//
// Megatron's fields and formats, plus the time since training started and the estimated time left (bridge's, so a
// run shows its progress without a callback), and, in a field of its own before the losses, the number of steps they
// are averaged over when more than one: a line's loss is the mean since the previous line, unlike the last step's
// that a summary shows. Every loss field stays Megatron's "lm loss: %.6E |", so parsers that split the line on '|'
// read it unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "training/callbacks/callback_context.h"

namespace bridge::training::utils {

/// Megatron's total_loss_dict: per-key loss sums since the last console line, in first-seen order, and the counters.
struct TotalLossDict {
  std::vector<std::pair<std::string, double>> loss_sums;
  int64_t advanced_iterations = 0;
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;
};

/// Adds one step (the reference's step 1): an advanced step adds each loss to its sum; a skipped step adds nothing
/// but counts as a NaN iteration when its losses sum to a non-finite value.
void accumulate_losses(TotalLossDict& total, const LossDict& loss_dict, bool skipped_iter);

/// Everything on a console line besides the losses.
struct LogLineFields {
  std::string timestamp;  ///< "YYYY-MM-DD HH:MM:SS"
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  int64_t skipped_samples = 0;  ///< shown when > 0
  double elapsed_ms_per_iteration = 0.0;
  std::optional<double> elapsed_seconds;    ///< since training started; shown when set, as H:MM:SS
  std::optional<double> eta_seconds;        ///< the estimated time left; shown when set, as H:MM:SS
  std::optional<double> tflops_per_device;  ///< shown when set (logging.log_throughput)
  double learning_rate = 0.0;
  int64_t global_batch_size = 0;
  double loss_scale = 1.0;
  std::optional<double> grad_norm;
  std::optional<int64_t> num_zeros_in_grad;
  std::optional<double> params_norm;
  std::vector<std::string> extra;  ///< " text |" fragments from on_log callbacks, before the counters
};

/// Megatron's console line (one line, no newline). Each loss prints its average over the advanced iterations when it
/// is non-negative, after a "losses averaged over: N steps |" field when N > 1; then the loss sums and all three
/// counters are reset, as the reference does after printing.
std::string format_log_line(const LogLineFields& fields, TotalLossDict& total);

/// The wall-clock time as "YYYY-MM-DD HH:MM:SS" (local time).
std::string log_timestamp();

}  // namespace bridge::training::utils
