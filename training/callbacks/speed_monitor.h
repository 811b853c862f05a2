// SpeedMonitor: training throughput over a rolling window of steps, and the model FLOP utilisation (Composer's
// SpeedMonitor, Lightning's ThroughputMonitor).
//
//   SpeedMonitorOptions options;
//   options.window_size = 20;     // steps
//   options.peak_tflops = 989.0;  // per device (H100 SXM, dense bf16); 0: looked up from the GPU's name
//   manager->add(std::make_shared<SpeedMonitor>(options));
//
// At each log step, in the record: "throughput/{batches,samples,tokens}_per_sec" and their "throughput/device/..."
// shares (the names of Megatron-Bridge's throughput report), "throughput/device/tflops_per_sec" from Megatron's FLOPs
// formula (utils::num_floating_point_operations), and "throughput/device/mfu" (a fraction) when the peak is known;
// the console line gets "tokens/s" and "MFU". These replace the loop's own throughput report under the same names
// (logging.log_throughput_to_tensorboard) when both are on. Time spent in evaluation is left out. The first report
// comes at the first log step after two steps have ended.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>

#include "training/callbacks/callback.h"

namespace bridge::training {
inline namespace callbacks {

struct SpeedMonitorOptions {
  std::int64_t window_size = 100;  ///< steps the rates are averaged over (the last ones, up to this many)
  /// Dense peak TFLOP/s of one device at the run's precision; 0: the GPU's bf16/fp16 peak when its name is known
  /// (A100, H100, H200, B200), otherwise no MFU.
  double peak_tflops = 0.0;
};

/// The dense bf16/fp16 peak TFLOP/s of a GPU by its CUDA name ("NVIDIA H100 80GB HBM3": 989), or nothing.
std::optional<double> known_peak_tflops(const std::string& device_name);

class SpeedMonitor : public Callback {
 public:
  /// Throws std::invalid_argument naming the option when one is out of range.
  explicit SpeedMonitor(SpeedMonitorOptions options = {});

  void on_train_start(CallbackContext& ctx) override;
  void on_train_step_end(CallbackContext& ctx) override;
  void on_eval_start(CallbackContext& ctx) override;
  void on_eval_end(CallbackContext& ctx) override;
  void on_log(CallbackContext& ctx) override;

  const SpeedMonitorOptions& options() const noexcept { return options_; }
  /// The peak the MFU is measured against (known at on_train_start), if any.
  std::optional<double> peak_tflops() const noexcept { return peak_tflops_; }

 private:
  using Clock = std::chrono::steady_clock;
  double seconds() const;  // since on_train_start, less the time in evaluation

  SpeedMonitorOptions options_;
  std::optional<double> peak_tflops_;
  double flops_per_step_ = 0.0;
  int world_size_ = 1;
  Clock::time_point start_;
  Clock::duration paused_{};
  Clock::time_point eval_start_;
  std::deque<double> history_;  // seconds() at the end of each recent step: window_size + 1 bracket window_size
};

}  // namespace callbacks
}  // namespace bridge::training
