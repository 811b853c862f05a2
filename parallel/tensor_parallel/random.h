// Named RNG streams (Megatron's CudaRNGStatesTracker), for the default CPU generator and, when LibTorch has CUDA,
// the current device's default CUDA generator. Dropout inside tensor-parallel regions must differ across TP ranks
// while dropout on replicated activations must not: the default stream stays identical across a TP group, and
// regions that need per-rank randomness run inside a fork of the "model-parallel-rng" stream.
//
//   model_parallel_manual_seed(seed + 100 * pp_rank);
//   { auto guard = get_rng_tracker().fork(); x = torch::dropout(x, 0.1, true); }
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace bridge::parallel::tensor_parallel {

inline constexpr char kModelParallelRngTrackerName[] = "model-parallel-rng";

class RngStatesTracker {
 public:
  /// While alive, the default generator(s) run the named stream; on exit the advanced stream is stored back and
  /// the default state restored.
  class ForkGuard {
   public:
    ForkGuard(const ForkGuard&) = delete;
    ForkGuard& operator=(const ForkGuard&) = delete;
    ~ForkGuard();

   private:
    friend class RngStatesTracker;
    ForkGuard(RngStatesTracker& tracker, std::string name);
    RngStatesTracker& tracker_;
    std::string name_;
    torch::Tensor saved_cpu_, saved_cuda_;
  };

  /// Forgets every stream and seed.
  void reset();
  /// A new stream seeded with `seed`; throws std::invalid_argument if the name or the seed is already in use.
  void add(const std::string& name, uint64_t seed);
  bool has(const std::string& name) const;
  /// The streams' generator states, CPU under `name` and CUDA (if any) under `name + "@cuda"`; copies.
  std::map<std::string, torch::Tensor> get_states() const;
  /// Replaces the streams with `states` as get_states returned them (seeds are kept, as in Megatron).
  void set_states(const std::map<std::string, torch::Tensor>& states);
  /// Runs the named stream until the guard ends; throws if `name` is unknown or already forked.
  [[nodiscard]] ForkGuard fork(const std::string& name = kModelParallelRngTrackerName);

 private:
  mutable std::mutex mutex_;
  std::map<std::string, torch::Tensor> states_;  // CPU states, and CUDA states under "<name>@cuda"
  std::set<uint64_t> seeds_;
  std::set<std::string> forked_;
  at::Device cuda_device_ = at::Device(at::kCUDA, 0);  // where the "@cuda" states were seeded (the current device)
};

/// The process's tracker.
RngStatesTracker& get_rng_tracker();

/// fn() in a fork of the tracker's model-parallel stream when `fork` is true, else as it is: for regions that draw
/// per-rank randomness unless a caller already runs them in the fork.
template <class Fn>
auto with_rng_fork(bool fork, Fn&& fn) {
  if (!fork) return fn();
  auto guard = get_rng_tracker().fork();
  return fn();
}

/// Every RNG stream a training step draws from: the default CPU generator, the current CUDA device's (undefined
/// without CUDA) and the tracker's streams. What checkpoints save and Megatron-Bridge protects around
/// on_data_init_start.
struct RngStates {
  torch::Tensor cpu;
  torch::Tensor cuda;
  std::map<std::string, torch::Tensor> tracker;
};
RngStates get_all_rng_states();
/// Restores what get_all_rng_states returned (a CUDA state only where CUDA is available).
void set_all_rng_states(const RngStates& states);

/// What checkpoint() runs: tensors in, tensors out.
using CheckpointedFunction = std::function<torch::autograd::variable_list(const torch::autograd::variable_list&)>;

/// Megatron's tensor_parallel.checkpoint (CheckpointFunction): runs `function(inputs)` keeping none of its
/// activations, only `inputs`; backward runs it again from those inputs, under the RNG states (CPU, CUDA and the
/// tracker's streams) that the first run started from, so dropout draws the same masks, and backpropagates through
/// that second run. Parameters inside `function` get their gradients during that inner backward (their hooks and
/// the grad buffer's fusion fire as usual). Under no_grad it is just `function(inputs)`.
///
///   hidden = checkpoint([&](const variable_list& in) { return variable_list{layer(in[0])}; }, {hidden})[0];
torch::autograd::variable_list checkpoint(CheckpointedFunction function, const torch::autograd::variable_list& inputs);

/// Seeds the default generators with `seed` (identical across a TP group; the CPU's and every CUDA device's, as
/// torch.manual_seed) and resets the tracker to one stream,
/// "model-parallel-rng", seeded with seed + 2718 + tp_rank. Pass seed + 100 * pp_rank, as Megatron's initialize
/// does, so pipeline stages draw differently. Needs initialize_model_parallel first.
void model_parallel_manual_seed(uint64_t seed);

}  // namespace bridge::parallel::tensor_parallel
