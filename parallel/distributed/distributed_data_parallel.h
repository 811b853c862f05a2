// Megatron-Core's DistributedDataParallel: the gradients of a model chunk live in one contiguous buffer per dtype,
// laid out in backward order and cut into buckets; on the last micro-batch each bucket's all-reduce starts as soon as
// all its gradients are final, so communication overlaps the rest of the backward pass.
//
//   DistributedDataParallel ddp(model);          // model: std::shared_ptr<torch::nn::Module>
//   ddp.zero_grad_buffer();                       // every step, instead of optimizer.zero_grad()
//   for (int m = 0; m < num_micro_batches; ++m) {
//     ddp.set_grad_sync(m == num_micro_batches - 1);
//     loss(m).backward();
//   }
//   ddp.finish_grad_sync();                       // grads now data-parallel averaged
//   optimizer.step();
//
// Expert-parallel parameters (ParamAttributes::allreduce false, MoE experts under expert parallelism) go into buffers
// and buckets of their own, reduced over the expert data-parallel group (Megatron's expert_parallel_buffers).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/process_group.h"

namespace bridge::parallel::distributed {

struct DistributedDataParallelConfig {
  bool overlap_grad_reduce = true;  ///< start each bucket's all-reduce during the last micro-batch's backward
  /// false: pre-scale grads by 1/dp then sum (Megatron's default; Gloo has no AVG); true: sum, then divide by the
  /// group's size. Either way an expert's grad ends as the sum over its expert data-parallel group divided by the
  /// dense dp (x cp) size: its grad on one rank already holds every expert-parallel rank's tokens.
  bool average_in_collective = false;
  /// Elements per bucket; 0 = Megatron's default max(40'000'000, 1'000'000 * dp). As in Megatron, without overlap
  /// every buffer is a single bucket (nothing is gained by splitting a reduction that starts after backward).
  int64_t bucket_size = 0;
  /// Keep the gradients of bf16/fp16 parameters in an fp32 buffer (Megatron's main_grad): each backward's param.grad
  /// is added into it and dropped, and the all-reduce runs in fp32. Without it the buffer has the parameters' dtype.
  bool grad_reduce_in_fp32 = false;
  /// Megatron's use_distributed_optimizer: the optimizer keeps state for this rank's 1/dp of each bucket
  /// (training::DistributedOptimizer), so each bucket is padded to a multiple of lcm(dp, 128) elements and
  /// reduce-scattered: after finish_grad_sync only this rank's 1/dp of every bucket holds the reduced gradient (the
  /// rest keeps this rank's own), half an all-reduce's traffic. The optimizer all-gathers the updates. Expert buckets
  /// are sharded over the expert data-parallel group (edp in place of dp).
  bool use_distributed_optimizer = false;
  /// Megatron's overlap_param_gather (with use_distributed_optimizer): the parameters' all-gather after the optimizer
  /// step is only started, and each bucket is waited for by the next forward just before its first layer that uses
  /// it (wait_for_param_gather, which bridge's GPTModel calls per layer), so the gathers overlap the forward. Until
  /// then a rank's parameters hold the new values of its own shard only; see finish_param_gathers.
  bool overlap_param_gather = false;
};

class DistributedDataParallel {
 public:
  /// Wraps one model chunk; grads of its parameters (those with requires_grad) become views into one contiguous buffer
  /// per dtype, laid out in reverse parameter order (backward order) and cut into buckets. `data_parallel_group`
  /// defaults to parallel_state's data-parallel group (with context parallel) and must outlive this object.
  /// `own_bucket`: under use_distributed_optimizer, parameters whose grads get a bucket of their own (Megatron's
  /// shared_embedding: the tied word embedding, whose grad is all-reduced between the first and last pipeline stage
  /// after the reduce-scatter, so both stages' copies must be sharded alike).
  /// `expert_data_parallel_group`: where the grads of expert-parallel parameters (allreduce false) are reduced, and
  /// under use_distributed_optimizer sharded; nullptr = parallel_state's expert data-parallel group, looked up only
  /// when some parameter is one. Must outlive this object. Both kinds are scaled by 1 / data_parallel_group's size.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, DistributedDataParallelConfig config = {},
                          ProcessGroup* data_parallel_group = nullptr,
                          const std::vector<torch::Tensor>& own_bucket = {},
                          ProcessGroup* expert_data_parallel_group = nullptr);
  ~DistributedDataParallel();
  DistributedDataParallel(DistributedDataParallel&&) noexcept;
  DistributedDataParallel& operator=(DistributedDataParallel&&) noexcept;
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  torch::nn::Module& module();
  const std::shared_ptr<torch::nn::Module>& module_ptr() const;
  const DistributedDataParallelConfig& config() const;
  /// The group the gradients are reduced over (the data-parallel group with context parallel by default).
  ProcessGroup& data_parallel_group() const;
  /// The group expert-parallel parameters' gradients are reduced over; nullptr when no wrapped parameter is one.
  ProcessGroup* expert_data_parallel_group() const;

  /// Zeroes the grad buffer (call at the start of every step instead of optimizer.zero_grad(), which would detach the
  /// views; LibTorch 2.x zero_grad defaults to set_to_none). Waits for reductions still in flight and re-attaches
  /// any grad that was replaced.
  void zero_grad_buffer();
  /// false = accumulate only (micro-batches before the last); true (the default) = this is the last micro-batch:
  /// buckets reduce as their grads become final.
  void set_grad_sync(bool enabled);
  bool grad_sync_enabled() const;
  /// Starts every bucket not started yet (overlap off, or params that got no grad), then waits for all; after it the
  /// grads are reduced and scaled (under use_distributed_optimizer, this rank's 1/dp of each bucket only, 1/edp of an
  /// expert bucket).
  void finish_grad_sync();
  /// Copies data-parallel rank 0's parameters to every rank (Megatron's broadcast_params); expert-parallel ones from
  /// expert data-parallel rank 0 over that group.
  void broadcast_params();
  /// Under use_distributed_optimizer (Megatron's start_param_sync), after the optimizer has written this rank's shard
  /// of every bucket's parameters: all-gathers the other ranks' shards into this rank's parameters, which are views of
  /// one parameter buffer per dtype laid out as the grad buffer, so the gathers write straight into them. In forward
  /// order, in windows of 4M elements a rank with two in flight (the collectives' staging stays small); with
  /// overlap_param_gather it only starts them, else it waits. A no-op without the distributed optimizer or at dp 1.
  void start_param_sync();
  /// Waits for this model chunk's parameter all-gathers still in flight (Megatron's finish_param_sync for every
  /// bucket).
  void finish_param_sync();

  /// The wrapped parameters that take part (requires_grad), in the module's order.
  const std::vector<torch::Tensor>& params() const;
  /// One flat buffer per (dtype, device); every param's main_grad is a view into one of them (fp32 for bf16/fp16
  /// params with grad_reduce_in_fp32, else the param's dtype).
  std::vector<torch::Tensor> grad_buffers() const;
  int64_t num_buckets() const;
  /// The bucket holding `param`'s grad, or -1 if `param` is not one of params().
  int64_t bucket_of(const torch::Tensor& param) const;
  /// Elements in bucket `index` (with its padding under use_distributed_optimizer: a multiple of its group's size).
  int64_t bucket_numel(int64_t index) const;
  /// Whether bucket `index` holds expert-parallel parameters' grads. The dense buckets come first, then the experts'.
  bool is_expert_bucket(int64_t index) const;
  /// The group bucket `index` is reduced over (and, under use_distributed_optimizer, sharded over):
  /// data_parallel_group() or, for an expert bucket, *expert_data_parallel_group().
  ProcessGroup& bucket_group(int64_t index) const;
  /// Megatron's param.main_grad: the view into the grad buffer holding `param`'s gradient. It is param.grad() itself
  /// when the buffer has the param's dtype; with grad_reduce_in_fp32 and a bf16/fp16 param it is the fp32 view, and
  /// param.grad() is undefined between backward passes. Throws std::invalid_argument for a param not wrapped here.
  torch::Tensor main_grad(const torch::Tensor& param) const;
  /// Buckets whose reduction has started since the last finish_grad_sync or zero_grad_buffer.
  int64_t buckets_started() const;
  /// How many buckets the most recent finish_grad_sync found already started by the backward pass.
  int64_t buckets_started_in_backward() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Megatron's forward pre-hook under overlap_param_gather: waits for the all-gathers of the buckets that hold
/// `module`'s parameters (recursively), so that the forward about to run reads the updated values. Returns at once when
/// no gather is in flight; a model's forward calls it for each layer before running it.
void wait_for_param_gather(const torch::nn::Module& module);
/// The same for one parameter (a weight a forward reads outside its module, as a tied output layer).
void wait_for_param_gather(const torch::Tensor& param);
/// Waits for every live DistributedDataParallel's parameter all-gathers. Anything that reads parameters outside a
/// forward between an optimizer step and the next forward (a checkpoint, the parameter norm, an export, a callback
/// that inspects weights) calls this first under overlap_param_gather; it starts no collective, so any subset of the
/// ranks may call it.
void finish_param_gathers();
/// Parameter all-gathers started and not yet waited for, over every live DistributedDataParallel (tests, statistics).
int64_t param_gathers_in_flight();

/// main_grad of whichever live DistributedDataParallel wraps `param`, or param.grad() for a parameter none wraps (the
/// grad norm, clipping and the tied-embedding sync read gradients through this).
torch::Tensor main_grad(const torch::Tensor& param);

/// main_grad of whichever live DistributedDataParallel wraps `param`, or an undefined tensor for a parameter none wraps
/// (the linear layers' gradient accumulation fusion adds into it only where it exists).
torch::Tensor wrapped_main_grad(const torch::Tensor& param);

}  // namespace bridge::parallel::distributed
