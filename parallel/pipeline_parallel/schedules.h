// Megatron's pipeline schedules: run a step's micro-batches forward and backward through this rank's model chunks,
// exchanging activations and gradients with the neighbouring stages. get_forward_backward_func() picks the schedule
// from parallel_state: no pipelining, 1F1B, or interleaved 1F1B over virtual pipeline chunks.
//
//   ForwardBackwardOptions options;
//   options.forward_step_func = [&](int64_t microbatch, int64_t chunk) { return std::pair{model(batch[mb]), loss}; };
//   options.set_input_tensor = {[&](const torch::Tensor& t) { model.set_input_tensor(t); }};
//   options.num_microbatches = 8;
//   options.tensor_shape = {seq, micro_batch, hidden};
//   auto reported = get_forward_backward_func()(options);   // per micro-batch on the last stage, else empty
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace bridge::parallel::pipeline_parallel {

/// What the last stage's loss function returns for one micro-batch (Megatron's loss_func).
struct LossOutput {
  torch::Tensor loss;        ///< scalar with grad: the sum of per-token losses when num_tokens is defined, else a mean
  torch::Tensor num_tokens;  ///< undefined (legacy form: loss is already a mean) or a scalar count of tokens in `loss`
  std::map<std::string, torch::Tensor> reported;  ///< detached values to log, e.g. "lm loss" -> [sum, count]
};
using LossFunc = std::function<LossOutput(const torch::Tensor& output_tensor)>;
/// Runs micro-batch `microbatch` through model chunk `model_chunk` and returns the chunk's output and, meaningful on
/// the last stage, the loss function. The caller binds data and model; the schedule has set the chunk's input tensor
/// (from the previous stage) before calling.
using ForwardStepFunc = std::function<std::pair<torch::Tensor, LossFunc>(int64_t microbatch, int64_t model_chunk)>;

struct ScheduleHooks {  // every member optional; called on this rank only
  std::function<void(int64_t microbatch, int64_t model_chunk)> on_forward_start, on_backward_start, on_backward_end;
  /// output = the loss on the last stage (after normalisation), activations elsewhere
  std::function<void(int64_t microbatch, int64_t model_chunk, const torch::Tensor& output)> on_forward_end;
};

struct ForwardBackwardOptions {
  ForwardStepFunc forward_step_func;
  /// One per model chunk held by this rank: gives the chunk its input from the previous stage (undefined tensor on
  /// the first stage).
  std::vector<std::function<void(const torch::Tensor&)>> set_input_tensor;
  int64_t num_microbatches = 1;
  std::vector<int64_t> tensor_shape;  ///< activation shape exchanged between stages, e.g. {seq, micro_batch, hidden}
  torch::Dtype dtype = torch::kFloat32;
  torch::Device device = torch::kCPU;  ///< where received activations and gradients are allocated
  /// Evaluation: no backward, no grad sync calls, no finalize; the forward passes run under torch::NoGradGuard.
  bool forward_only = false;
  /// If false: loss /= clamp(num_tokens, 1) (when defined) and /= num_microbatches, as Megatron. If true, a loss
  /// with num_tokens is left as a sum (the caller divides the grads by the global token count); a legacy loss
  /// (no num_tokens) is still divided by num_microbatches, as in Megatron.
  bool calculate_per_token_loss = false;
  std::optional<int64_t> microbatch_group_size_per_vp_stage;  ///< interleaved only; default pp
  /// Data-parallel gradient sync control: called with false before each backward pass that is not the step's last
  /// one and with true before the last backward (Megatron's no_sync / is_last_microbatch). May be empty.
  std::function<void(bool enabled)> set_grad_sync;
  /// Megatron's config.grad_scale_func: applied to the last stage's loss before its backward (fp16 loss scaling).
  /// May be empty.
  std::function<torch::Tensor(const torch::Tensor& loss)> grad_scale_func;
  /// Called once after the last backward (not when forward_only), e.g. DDP finish + embedding grad all-reduce.
  std::function<void()> finalize_model_grads;
  ScheduleHooks hooks;
};

using ReportedValues = std::vector<std::map<std::string, torch::Tensor>>;

/// On the last pipeline stage: each micro-batch's LossOutput::reported, in micro-batch order; elsewhere empty.
ReportedValues forward_backward_no_pipelining(const ForwardBackwardOptions&);
ReportedValues forward_backward_pipelining_without_interleaving(const ForwardBackwardOptions&);
ReportedValues forward_backward_pipelining_with_interleaving(const ForwardBackwardOptions&);
using ForwardBackwardFunc = ReportedValues (*)(const ForwardBackwardOptions&);
/// Megatron's dispatcher from parallel_state: pp == 1 -> no pipelining, pp > 1 without virtual pipeline -> 1F1B,
/// with -> interleaved.
ForwardBackwardFunc get_forward_backward_func();

/// The interleaved schedule's order of (microbatch, model_chunk) forward passes (Megatron's get_schedule_table).
std::vector<std::pair<int64_t, int64_t>> get_schedule_table(int64_t num_microbatches, int64_t num_model_chunks,
                                                            int64_t microbatch_group_size_per_vp_stage);
/// Warmup forward passes of the 1F1B schedule on pipeline rank `rank` of `pp`: min(pp - rank - 1, m).
int64_t num_warmup_microbatches(int64_t pp, int64_t rank, int64_t num_microbatches);
/// Warmup forward passes of the interleaved schedule: min((pp - rank - 1) * 2 + (v - 1) * G, m * v).
int64_t num_interleaved_warmup_microbatches(int64_t pp, int64_t rank, int64_t num_microbatches,
                                            int64_t num_model_chunks, int64_t microbatch_group_size_per_vp_stage);

/// One forward or backward pass in a rank's program.
struct ScheduleStep {
  bool forward = true;
  int64_t microbatch = 0;
  int64_t model_chunk = 0;
  bool operator==(const ScheduleStep& other) const {
    return forward == other.forward && microbatch == other.microbatch && model_chunk == other.model_chunk;
  }
};
/// The order in which pipeline rank `rank` runs its passes: 1F1B (warmup forwards, one forward one backward, cooldown
/// backwards), and the interleaved schedule over `num_model_chunks` chunks (backward chunk = v - 1 - forward chunk).
std::vector<ScheduleStep> get_1f1b_order(int64_t pp, int64_t rank, int64_t num_microbatches, bool forward_only);
std::vector<ScheduleStep> get_interleaved_order(int64_t pp, int64_t rank, int64_t num_microbatches,
                                                int64_t num_model_chunks, int64_t microbatch_group_size_per_vp_stage,
                                                bool forward_only);
/// Throws std::invalid_argument unless pp <= G <= m and (m % G == 0 or m % G >= pp) (Megatron's rule against
/// dependency bubbles), naming the fields.
void check_interleaved_schedule(int64_t pp, int64_t num_microbatches, int64_t microbatch_group_size_per_vp_stage);

}  // namespace bridge::parallel::pipeline_parallel
