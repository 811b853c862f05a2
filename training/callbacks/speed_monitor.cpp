// SpeedMonitor: step-end times in a window, rates and FLOP utilisation at log steps.
#include "training/callbacks/speed_monitor.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "training/config/config.h"
#include "training/utils/cuda_memory.h"
#include "training/utils/flop_utils.h"
#include "training/utils/train_utils.h"
#include "utils/logging.h"

namespace bridge::training {
inline namespace callbacks {

std::optional<double> known_peak_tflops(const std::string& device_name) {
  // Dense (not the datasheets' sparsity figures) bf16 tensor-core peaks of the SXM parts; PCIe H100s run lower.
  struct Entry {
    const char* name;
    double tflops;
  };
  static constexpr Entry kPeaks[] = {{"H100 PCIe", 756.0}, {"H100", 989.0}, {"H200", 989.0}, {"H800", 989.0},
                                     {"B200", 2250.0},     {"A100", 312.0}, {"A800", 312.0}, {"L40S", 362.0}};
  for (const Entry& entry : kPeaks) {
    if (device_name.find(entry.name) != std::string::npos) return entry.tflops;
  }
  return std::nullopt;
}

SpeedMonitor::SpeedMonitor(SpeedMonitorOptions options) : options_(options) {
  if (options_.window_size < 1) {
    throw std::invalid_argument("SpeedMonitor.window_size is " + std::to_string(options_.window_size) +
                                "; average over 1 or more steps");
  }
  if (!(options_.peak_tflops >= 0.0) || !std::isfinite(options_.peak_tflops)) {
    throw std::invalid_argument(fmt::format(
        "SpeedMonitor.peak_tflops is {:.6g}; use the device's peak TFLOP/s, or 0 to look it up from the GPU's name",
        options_.peak_tflops));
  }
}

void SpeedMonitor::on_train_start(CallbackContext& ctx) {
  start_ = Clock::now();
  paused_ = {};
  history_.clear();
  world_size_ = parallel::is_distributed_initialized() ? parallel::get_world_size() : 1;
  if (ctx.state.cfg == nullptr) return;  // a context outside pretrain(): rates only
  const ConfigContainer& config = *ctx.state.cfg;
  flops_per_step_ = utils::num_floating_point_operations(config.model, config.train.global_batch_size,
                                                         config.parallelism.tensor_model_parallel_size);
  peak_tflops_.reset();
  if (options_.peak_tflops > 0.0) {
    peak_tflops_ = options_.peak_tflops;
  } else if (const std::optional<std::string> name = utils::cuda_device_name()) {
    if (config.mixed_precision.enabled()) peak_tflops_ = known_peak_tflops(*name);
    if (!peak_tflops_) {
      bridge::utils::logger().info("SpeedMonitor: no {} peak known for '{}'; set SpeedMonitor.peak_tflops for MFU",
                                   config.mixed_precision.enabled() ? "bf16/fp16" : "fp32", *name);
    }
  }
}

double SpeedMonitor::seconds() const { return std::chrono::duration<double>(Clock::now() - start_ - paused_).count(); }

void SpeedMonitor::on_train_step_end(CallbackContext&) {
  history_.push_back(seconds());
  while (static_cast<std::int64_t>(history_.size()) > options_.window_size + 1) history_.pop_front();
}

void SpeedMonitor::on_eval_start(CallbackContext&) { eval_start_ = Clock::now(); }

void SpeedMonitor::on_eval_end(CallbackContext&) { paused_ += Clock::now() - eval_start_; }

void SpeedMonitor::on_log(CallbackContext& ctx) {
  if (history_.size() < 2 || ctx.state.cfg == nullptr) return;
  const ConfigContainer& config = *ctx.state.cfg;
  // The window so far: report_throughput counts window - 1 steps between the first and last timestamps.
  const utils::StatReport report =
      utils::report_throughput(config.train, ctx.state.train_state.step, config.model.seq_length, history_,
                               static_cast<std::int64_t>(history_.size()), world_size_);
  if (report.empty()) return;
  auto& metrics = ctx.log->metrics;
  for (const auto& [name, value] : report) metrics[name] = utils::to_double(value);
  const double steps_per_second = metrics["throughput/batches_per_sec"];
  const double tflops = flops_per_step_ * steps_per_second / world_size_ / 1e12;
  metrics["throughput/device/tflops_per_sec"] = tflops;
  ctx.log->text.push_back(fmt::format("tokens/s: {:.1f}", metrics["throughput/tokens_per_sec"]));
  if (peak_tflops_) {
    metrics["throughput/device/mfu"] = tflops / *peak_tflops_;
    ctx.log->text.push_back(fmt::format("MFU: {:.1f}%", 100.0 * tflops / *peak_tflops_));
  }
}

}  // namespace callbacks
}  // namespace bridge::training
