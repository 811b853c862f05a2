// The training log's accumulation and Megatron's console line, field by field in the reference's order and formats.
#include "training/utils/training_log.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "utils/strings.h"

namespace bridge::training::utils {
namespace {

template <class... Args>
std::string format(const char* pattern, Args... args) {
  char text[256];
  std::snprintf(text, sizeof(text), pattern, args...);
  return text;
}

}  // namespace

void accumulate_losses(TotalLossDict& total, const LossDict& loss_dict, bool skipped_iter) {
  if (!skipped_iter) total.advanced_iterations += 1;
  total.skipped_iterations += skipped_iter ? 1 : 0;
  bool got_nan = false;
  for (const auto& [key, value] : loss_dict) {
    const double loss = value.item<double>();
    auto it = std::find_if(total.loss_sums.begin(), total.loss_sums.end(),
                           [&key = key](const auto& entry) { return entry.first == key; });
    if (it == total.loss_sums.end()) {
      total.loss_sums.emplace_back(key, 0.0);
      it = total.loss_sums.end() - 1;
    }
    if (!skipped_iter) {
      it->second += loss;
    } else if (!std::isfinite(loss)) {
      got_nan = true;
    }
  }
  total.nan_iterations += got_nan ? 1 : 0;
}

std::string format_log_line(const LogLineFields& f, TotalLossDict& total) {
  std::string line = " [" + f.timestamp + "]";
  line +=
      format(" iteration %8lld/%8lld |", static_cast<long long>(f.iteration), static_cast<long long>(f.train_iters));
  line += format(" consumed samples: %12lld |", static_cast<long long>(f.consumed_samples));
  if (f.skipped_samples > 0) line += format(" skipped samples: %12lld |", static_cast<long long>(f.skipped_samples));
  line += format(" elapsed time per iteration (ms): %.1f |", f.elapsed_ms_per_iteration);
  if (f.elapsed_seconds) line += " elapsed: " + bridge::utils::format_duration(*f.elapsed_seconds) + " |";
  if (f.eta_seconds) line += " ETA: " + bridge::utils::format_duration(*f.eta_seconds) + " |";
  if (f.tflops_per_device) line += format(" throughput per GPU (TFLOP/s/GPU): %.1f |", *f.tflops_per_device);
  line += format(" learning rate: %.6E |", f.learning_rate);
  line += format(" global batch size: %5lld |", static_cast<long long>(f.global_batch_size));
  const double advanced = static_cast<double>(std::max<int64_t>(1, total.advanced_iterations));
  // Said on the line, as a summary shows the last step's loss: the losses here are the interval's means. A field of
  // its own, so every loss field stays Megatron's "name: value |" for parsers that split on '|'.
  if (total.advanced_iterations > 1) {
    line += format(" losses averaged over: %lld steps |", static_cast<long long>(total.advanced_iterations));
  }
  for (auto& [key, sum] : total.loss_sums) {
    const double average = sum / advanced;
    if (average >= 0.0) line += " " + key + format(": %.6E |", average);
    sum = 0.0;
  }
  line += format(" loss scale: %.1f |", f.loss_scale);
  if (f.grad_norm) line += format(" grad norm: %.3f |", *f.grad_norm);
  if (f.num_zeros_in_grad) line += format(" num zeros: %lld |", static_cast<long long>(*f.num_zeros_in_grad));
  if (f.params_norm) line += format(" params norm: %.3f |", *f.params_norm);
  for (const std::string& text : f.extra) line += " " + text + " |";
  line += format(" number of skipped iterations: %3lld |", static_cast<long long>(total.skipped_iterations));
  line += format(" number of nan iterations: %3lld |", static_cast<long long>(total.nan_iterations));
  total.advanced_iterations = 0;
  total.skipped_iterations = 0;
  total.nan_iterations = 0;
  return line;
}

std::string log_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", &local);
  return text;
}

}  // namespace bridge::training::utils
