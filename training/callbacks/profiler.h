// Profiler: records LibTorch's autograd profiler over a window of training steps and writes one Chrome trace per
// rank (open it in chrome://tracing or https://ui.perfetto.dev), as torch.profiler's schedule(wait, active) with
// tensorboard_trace_handler does in Python.
//
//   ProfilerOptions options;
//   options.start_step = 10;            // skip start-up and the first steps' allocations
//   options.num_steps = 3;
//   options.output_dir = "profile";     // profile/trace_rank<r>.json
//   manager->add(std::make_shared<Profiler>(options));
//
// Each profiled step is one "ProfilerStep#<step>" range around the operators it ran. The recording covers the
// operators the training thread runs (and its intra-op workers); on a GPU it holds the host side only (operator
// times, not kernel times). A trace is written when its window ends, or when training ends inside it (on_train_end or
// the callback's destruction), through a temporary file renamed into place, so a crash never leaves half a trace.
#pragma once

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "training/callbacks/callback.h"

namespace torch::autograd::profiler {
struct RecordProfile;
}  // namespace torch::autograd::profiler

namespace at {
struct RecordFunction;
}  // namespace at

namespace bridge::training {
inline namespace callbacks {

struct ProfilerOptions {
  int64_t start_step = 5;              ///< the first step recorded (steps count from 1)
  int64_t num_steps = 3;               ///< steps recorded (> 0)
  std::string output_dir = "profile";  ///< trace_rank<r>.json goes here (created when missing)
  std::vector<int64_t> ranks;          ///< the global ranks that record; empty = every rank
};

class Profiler : public Callback {
 public:
  /// Throws std::invalid_argument naming the option when one is out of range.
  explicit Profiler(ProfilerOptions options);
  ~Profiler() override;

  void on_train_start(CallbackContext& ctx) override;
  void on_train_step_start(CallbackContext& ctx) override;
  void on_train_step_end(CallbackContext& ctx) override;
  void on_train_end(CallbackContext& ctx) override;

  /// The trace this rank writes (set at on_train_start; empty when this rank does not record).
  const std::string& trace_path() const { return trace_path_; }

 private:
  void finish();  // stops recording and writes the trace

  ProfilerOptions options_;
  std::string trace_path_;
  std::ostringstream trace_;
  std::unique_ptr<torch::autograd::profiler::RecordProfile> recording_;
  std::unique_ptr<at::RecordFunction> step_range_;
  std::string step_name_;  // "ProfilerStep#<n>" of the step in flight
  bool written_ = false;
};

}  // namespace callbacks
}  // namespace bridge::training
