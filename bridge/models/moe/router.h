// The MoE router (Megatron-Core's TopKRouter): a gate [E, h] scores each token against every expert in fp32, picks
// its top-k experts (moe_utils' routing), drops tokens past an expert's capacity, and in training attaches the
// load-balancing and z losses to its outputs so their gradients reach the gate (moe_utils' attach_aux_loss). With the
// auxiliary-loss-free balance (moe_router_enable_expert_bias) it counts tokens per expert for the update that
// update_expert_bias() makes after the gradient sync. The auxiliary losses' token counts are summed over the ranks that
// hold parts of the same sequences (tensor x context parallel, Megatron's tp_cp group), the global one's over tensor x
// data x context parallel.
#pragma once

#include <torch/torch.h>

#include <string>

#include "bridge/models/gpt_config.h"
#include "bridge/models/moe/moe_utils.h"

namespace bridge::models::moe {

class TopKRouterImpl : public torch::nn::Module {
 public:
  /// `layer_number`: the layer's global index (names and seeds the gate, keys the logged losses).
  TopKRouterImpl(const GPTConfig& config, int64_t layer_number);

  /// `hidden_states`: [s, b, h] (this rank's part of the sequence under sequence parallelism). Returns the routing of
  /// its s x b tokens, rows in the order of hidden_states.reshape({-1, h}); probabilities in fp32 (fp64 with
  /// moe_router_dtype fp64).
  Routing forward(const torch::Tensor& hidden_states);

  /// The gate's logits [T, E] for `hidden_states` (no losses, no bookkeeping).
  torch::Tensor gating(const torch::Tensor& hidden_states) const;

  /// Aux-loss-free balance: the bias moved by `update_rate` toward balance given the tokens each expert got over
  /// the step on every rank (`tokens_per_expert`, summed over the tensor x data x context-parallel group, Megatron's
  /// tp_dp_cp: every rank of the stage routes tokens of its own), and the count reset.
  void update_expert_bias(const torch::Tensor& tokens_per_expert);

  torch::Tensor weight;                   ///< [E, h], the gate
  torch::Tensor expert_bias;              ///< [E] fp32 buffer (moe_router_enable_expert_bias), else undefined
  torch::Tensor local_tokens_per_expert;  ///< [E] fp32: tokens routed to each expert since the last update

  int64_t layer_number() const { return layer_number_; }

  /// Module::to, keeping expert_bias in fp32 (Megatron-Core keeps it fp32 under bf16: its updates of 1e-3 would be
  /// lost in bf16's 8-bit mantissa).
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  using torch::nn::Module::to;
  /// global_aux_loss: the counts accumulated over the step restart (Megatron-Core resets them in
  /// finalize_model_grads).
  void reset_global_tokens();

 private:
  torch::Tensor apply_z_loss(torch::Tensor logits);
  torch::Tensor apply_load_balancing_loss(const torch::Tensor& logits, torch::Tensor probs, int64_t seq_length);

  GPTConfig config_;
  int64_t layer_number_;
  torch::ScalarType router_dtype_;
  torch::Tensor global_tokens_per_expert_;  // global_aux_loss: counts accumulated over the step's micro-batches
  int64_t global_aux_steps_ = 0;
};
TORCH_MODULE(TopKRouter);

}  // namespace bridge::models::moe
