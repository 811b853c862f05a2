// Profiler: LibTorch's autograd profiler (the legacy RecordProfile, the same in LibTorch 1.13 and 2.x) over a window
// of steps, written as a Chrome trace per rank.
#include "training/callbacks/profiler.h"

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include "parallel/distributed.h"
#include "utils/durable_file.h"
#include "utils/logging.h"

namespace bridge::training {
inline namespace callbacks {

Profiler::Profiler(ProfilerOptions options) : options_(std::move(options)) {
  if (options_.start_step < 1) {
    throw std::invalid_argument(fmt::format("Profiler.start_step is {}; steps count from 1", options_.start_step));
  }
  if (options_.num_steps < 1) {
    throw std::invalid_argument(fmt::format("Profiler.num_steps is {}; record 1 step or more", options_.num_steps));
  }
  if (options_.output_dir.empty()) {
    throw std::invalid_argument("Profiler.output_dir is empty; name the directory for the traces, e.g. profile");
  }
}

Profiler::~Profiler() {
  // An exit (signal, exit_interval) or a failure inside the window skips on_train_end: keep the trace anyway.
  if (recording_ && !written_) {
    try {
      finish();
    } catch (...) {  // a destructor must not throw; finish() logs what went wrong
    }
  }
}

void Profiler::on_train_start(CallbackContext& ctx) {
  const bool distributed = parallel::is_distributed_initialized();
  const int rank = distributed ? parallel::get_rank() : 0;
  const int world_size = distributed ? parallel::get_world_size() : 1;
  for (const int64_t r : options_.ranks) {
    if (r < 0 || r >= world_size) {
      throw std::invalid_argument(
          fmt::format("Profiler.ranks holds {}, but the job has ranks 0 to {}", r, world_size - 1));
    }
  }
  const bool records =
      options_.ranks.empty() || std::find(options_.ranks.begin(), options_.ranks.end(), rank) != options_.ranks.end();
  trace_path_ = records ? (std::filesystem::path(options_.output_dir) / fmt::format("trace_rank{}.json", rank)).string()
                        : std::string();
  const int64_t last_step = options_.start_step + options_.num_steps - 1;
  if (records && ctx.state.cfg != nullptr && ctx.state.train_state.step >= last_step) {
    bridge::utils::logger().warn("Profiler: training starts after step {}, past the window (steps {} to {}); no trace",
                                 ctx.state.train_state.step, options_.start_step, last_step);
  }
}

void Profiler::on_train_step_start(CallbackContext& ctx) {
  if (trace_path_.empty() || written_) return;
  const int64_t step = ctx.iteration();  // the step in flight, numbered as the log numbers it
  if (step < options_.start_step || step >= options_.start_step + options_.num_steps) return;
  if (!recording_) recording_ = std::make_unique<torch::autograd::profiler::RecordProfile>(trace_);
  step_name_ = "ProfilerStep#" + std::to_string(step);
  step_range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (step_range_->isActive()) step_range_->before(step_name_.c_str());
}

void Profiler::on_train_step_end(CallbackContext& ctx) {
  if (!recording_) return;
  step_range_.reset();
  if (ctx.iteration() >= options_.start_step + options_.num_steps - 1) finish();
}

void Profiler::on_train_end(CallbackContext&) {
  if (recording_) finish();  // training stopped inside the window
}

void Profiler::finish() {
  step_range_.reset();
  recording_.reset();  // stops the profiler and writes the events to trace_
  written_ = true;
  const std::string trace = trace_.str();
  bridge::utils::write_file_durably(trace_path_, trace);
  bridge::utils::log_info_on_this_rank(fmt::format(
      "Profiler: wrote {} ({} bytes; open it in chrome://tracing or ui.perfetto.dev)", trace_path_, trace.size()));
}

}  // namespace callbacks
}  // namespace bridge::training
