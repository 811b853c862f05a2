// The MoE math shared by the router, the token dispatchers and the layer (Megatron-Core's moe_utils.py): top-k routing
// with its score functions, the load-balancing and z losses, capacity dropping, token permutation, the autograd hook
// that adds an auxiliary loss's gradient, and the auxiliary-loss-free expert-bias update.
//
// Tokens are rows: [T, h] hidden states, [T, E] router logits, probabilities and routing maps (bool, true where a token
// goes to an expert).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>

#include "bridge/models/moe/moe_config.h"

namespace bridge::models::moe {

/// Top-k routing's result: the routing probabilities (0 where a token is not routed) and where it is routed.
struct Routing {
  torch::Tensor probs;        ///< [T, E], float
  torch::Tensor routing_map;  ///< [T, E], bool, topk true per row
};

/// Megatron-Core's topk_routing_with_score_function, in fp32 (fp64 when the logits are): softmax (over the k chosen
/// logits, or over all before top-k with `use_pre_softmax`) or sigmoid (the k chosen renormalised); `expert_bias`
/// (defined: sigmoid only) shifts the choice, not the weights; `num_groups`/`group_topk` limit the choice to the best
/// groups (a group scores by the sum of its best topk / group_topk scores); `scaling_factor` multiplies the result.
Routing topk_routing_with_score_function(const torch::Tensor& logits, int64_t topk, bool use_pre_softmax,
                                         std::optional<int64_t> num_groups, std::optional<int64_t> group_topk,
                                         std::optional<double> scaling_factor, MoERouterScoreFunction score_function,
                                         const torch::Tensor& expert_bias = {});

/// Megatron-Core's compute_routing_scores_for_aux_loss: the scores over all experts the balancing losses use
/// (softmax, or sigmoid normalised to sum 1) and their plain top-k map.
Routing compute_routing_scores_for_aux_loss(const torch::Tensor& logits, int64_t topk,
                                            MoERouterScoreFunction score_function);

/// Megatron-Core's switch_load_balancing_loss_func: coeff * E / (k * T^2) * sum_i (sum_t probs_ti) * N_i, where
/// `tokens_per_expert` (N) counts the top-k assignments over `total_num_tokens` (T) tokens. `probs` may hold only this
/// rank's tokens (then the ranks' losses add up to the loss over all T).
torch::Tensor switch_load_balancing_loss_func(const torch::Tensor& probs, const torch::Tensor& tokens_per_expert,
                                              int64_t total_num_tokens, int64_t topk, int64_t num_experts,
                                              double coeff);

/// Megatron-Core's z_loss_func: coeff * mean over tokens of logsumexp(logits)^2 (ST-MoE).
torch::Tensor z_loss_func(const torch::Tensor& logits, double coeff);

/// Megatron-Core's get_capacity: ceil(num_tokens / num_experts * capacity_factor), num_tokens counting each of a
/// token's k assignments.
int64_t get_capacity(int64_t num_tokens, int64_t num_experts, double capacity_factor);

/// Megatron-Core's apply_router_token_dropping: each expert keeps at most `capacity` of its tokens, those with the
/// highest probability (kProbs) or the earliest (kPosition); with `pad_to_capacity` every expert takes exactly
/// `capacity` tokens (zero-probability ones where it had fewer). Returns the kept probabilities and map.
Routing apply_router_token_dropping(const Routing& routing, int64_t capacity, MoETokenDropPolicy drop_policy,
                                    bool pad_to_capacity);

/// The rows of `tokens` grouped by expert (expert 0's tokens in token order, then expert 1's, ...), as Megatron-Core's
/// permute with a routing map: a token routed to j experts appears j times.
struct Permutation {
  torch::Tensor tokens;             ///< [N, h], N = routing_map.sum()
  torch::Tensor probs;              ///< [N], each row's routing probability
  torch::Tensor sorted_indices;     ///< [N] int64, the source row of each permuted row
  torch::Tensor tokens_per_expert;  ///< [E] int64 (CPU)
};
Permutation permute(const torch::Tensor& tokens, const torch::Tensor& probs, const torch::Tensor& routing_map);

/// The inverse of permute: row i of `permuted` is added into row sorted_indices[i] of a [num_tokens, h] zero tensor
/// (a token's experts summed). Differentiable.
torch::Tensor unpermute(const torch::Tensor& permuted, const torch::Tensor& sorted_indices, int64_t num_tokens);

/// Megatron-Core's MoEAuxLossAutoScaler: returns `output` unchanged, and its backward also gives `aux_loss` the
/// gradient main_loss_backward_scale, so an auxiliary loss reaches the router without being added to the main loss.
torch::Tensor attach_aux_loss(const torch::Tensor& output, const torch::Tensor& aux_loss);
/// The gradient attach_aux_loss gives: main_loss_backward_scale(...) of the step, set by the training loop before each
/// step, as Megatron's schedule sets MoEAuxLossAutoScaler.main_loss_backward_scale.
void set_aux_loss_backward_scale(double scale);
double aux_loss_backward_scale();
/// Megatron-Core's schedule's scale for the auxiliary losses (without calculate_per_token_loss): loss_scale (fp16's,
/// else 1) x context_parallel_size / num_microbatches. The context-parallel factor: each cp rank's auxiliary loss is
/// its share of the loss of the sequences it holds part of (the shares add up over tp x cp, see TopKRouter), while the
/// gradient mean over dp x cp divides every rank's contribution by cp as well.
double main_loss_backward_scale(double loss_scale, int64_t num_microbatches, int64_t context_parallel_size);

/// Megatron-Core's get_updated_expert_bias: bias + rate * sign(mean(tokens) - tokens) per expert ([layers, E] or
/// [E]): experts that got fewer tokens than the mean are raised, busier ones lowered.
torch::Tensor get_updated_expert_bias(const torch::Tensor& tokens_per_expert, const torch::Tensor& expert_bias,
                                      double update_rate);

}  // namespace bridge::models::moe
