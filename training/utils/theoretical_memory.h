// Megatron's theoretical memory report for one rank: the weights, gradients and optimizer state of its model shard and
// the activations its pipeline stage keeps for the micro-batches in flight. pretrain() compares it with the memory
// the rank can have before allocating anything, so a model that cannot fit fails with the keys to change instead of
// deep in the allocator.
//
//   const MemoryEstimate estimate = estimate_memory(config, world_size);
//   logger().info("theoretical memory per rank: {}", describe(estimate));
#pragma once

#include <cstdint>
#include <string>

namespace bridge::models {
struct GPTConfig;
}
namespace bridge::training {
struct ConfigContainer;
}

namespace bridge::training::utils {

/// Bytes one rank needs, for the most loaded pipeline stage (the first or the last). In doubles so that absurd sizes
/// (hidden 1M, 100k layers) give an estimate rather than an overflow.
struct MemoryEstimate {
  double parameters = 0;   ///< this rank's parameter count
  double weights = 0;      ///< the parameters in their dtype (bf16/fp16 or fp32)
  double gradients = 0;    ///< the gradient buffer (fp32 with grad_reduce_in_fp32)
  double optimizer = 0;    ///< Adam's two moments (or SGD's momentum) and, under mixed precision, fp32 master weights
  double activations = 0;  ///< kept for backward: per layer, for every micro-batch in flight, and the logits
  int64_t microbatches_in_flight = 1;

  double total() const { return weights + gradients + optimizer + activations; }
};

/// Parameters of the whole model, exactly: the embeddings (a position table only with learned positions), per layer
/// QKV (grouped), the projection, the MLP (gated or not), their biases and the norms (LayerNorm or RMSNorm, q/k norms),
/// the final norm, and the output layer when it is not tied; the vocabulary padded as for `tensor_model_parallel_size`.
double num_parameters(const models::GPTConfig& model, int tensor_model_parallel_size);

/// The estimate for a job of `world_size` ranks. The activations follow Korthikanti et al. 2022 without sequence
/// parallelism, with the model's recomputation (full: the checkpointed runs' inputs and one run rebuilt at a time;
/// selective: without core_attn's s x s probabilities or mlp's outputs), counting only what is certainly kept: a lower
/// bound, so a run it rejects cannot fit. Beyond Korthikanti: RMSNorm's normalised inputs and RoPE's rotated q and k.
/// Context parallelism (parallelism.context_parallel_size) gives every per-token term this rank's s / cp tokens,
/// replaces the attention's part with what model.cp_comm_type keeps (all_gather: the whole sequence's keys and values
/// and the fp32 probabilities of the local queries over them; a2a: the heads-for-sequence copies of q, k, v and the
/// output; p2p: the local q, k, v, output and log-sum-exp) and adds its backward's working set at the last layer where
/// that is the peak; parameters, gradients and optimizer state are replicated over cp as over dp (the distributed
/// optimizer shards over dp x cp).
MemoryEstimate estimate_memory(const ConfigContainer& config, int world_size);

/// The estimate's parts: "3.2 GiB (weights 1.0 GiB, gradients 1.0 GiB, optimizer 1.0 GiB, activations 0.2 GiB for 4
/// micro-batches in flight)".
std::string describe(const MemoryEstimate& estimate);

/// "1.5 GiB", "12.0 MiB", "3.1 PiB".
std::string format_bytes(double bytes);

}  // namespace bridge::training::utils
