// MoE math (Megatron-Core's moe_utils.py): routing, balancing losses, capacity, permutation.
#include "bridge/models/moe/moe_utils.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace bridge::models::moe {
namespace {

using torch::indexing::Slice;

// torch::topk over the experts, or within the best groups (Megatron-Core's group_limited_topk).
std::tuple<torch::Tensor, torch::Tensor> compute_topk(const torch::Tensor& scores, int64_t topk,
                                                      std::optional<int64_t> num_groups,
                                                      std::optional<int64_t> group_topk) {
  if (!group_topk) return torch::topk(scores, topk, /*dim=*/1);
  const int64_t tokens = scores.size(0);
  const int64_t experts = scores.size(1);
  const int64_t groups = *num_groups;
  const torch::Tensor group_scores =
      std::get<0>(scores.view({tokens, groups, experts / groups}).topk(topk / *group_topk, /*dim=*/-1)).sum(-1);
  const torch::Tensor group_idx = std::get<1>(torch::topk(group_scores, *group_topk, /*dim=*/-1));
  const torch::Tensor group_mask = torch::zeros_like(group_scores).scatter_(1, group_idx, 1.0).to(torch::kBool);
  const torch::Tensor score_mask =
      group_mask.unsqueeze(-1).expand({tokens, groups, experts / groups}).reshape({tokens, experts});
  return torch::topk(scores.masked_fill(score_mask.logical_not(), -std::numeric_limits<double>::infinity()), topk,
                     /*dim=*/-1);
}

torch::Tensor map_of(const torch::Tensor& logits, const torch::Tensor& top_indices) {
  return torch::zeros(logits.sizes(), logits.options().dtype(torch::kBool))
      .scatter(1, top_indices, torch::ones_like(top_indices, torch::kBool));
}

std::atomic<double>& backward_scale() {
  static std::atomic<double> scale{1.0};
  return scale;
}

// Megatron-Core's MoEAuxLossAutoScaler.
class AuxLossAutoScaler : public torch::autograd::Function<AuxLossAutoScaler> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& output,
                               const torch::Tensor& aux_loss) {
    ctx->saved_data["aux_shape"] = aux_loss.sizes().vec();
    ctx->saved_data["aux_dtype"] = static_cast<int64_t>(aux_loss.scalar_type());
    ctx->saved_data["aux_device"] = aux_loss.device().str();
    return output.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto options = torch::TensorOptions()
                             .dtype(static_cast<torch::ScalarType>(ctx->saved_data["aux_dtype"].toInt()))
                             .device(torch::Device(ctx->saved_data["aux_device"].toStringRef()));
    torch::Tensor aux_grad = torch::full(ctx->saved_data["aux_shape"].toIntVector(), backward_scale().load(), options);
    return {grads[0], aux_grad};
  }
};

}  // namespace

Routing topk_routing_with_score_function(const torch::Tensor& logits, int64_t topk, bool use_pre_softmax,
                                         std::optional<int64_t> num_groups, std::optional<int64_t> group_topk,
                                         std::optional<double> scaling_factor, MoERouterScoreFunction score_function,
                                         const torch::Tensor& expert_bias) {
  torch::Tensor probs, top_indices;
  if (score_function == MoERouterScoreFunction::kSoftmax) {
    if (use_pre_softmax) {
      const torch::Tensor scores = torch::softmax(logits, -1);
      std::tie(probs, top_indices) = compute_topk(scores, topk, num_groups, group_topk);
    } else {
      torch::Tensor top_logits;
      std::tie(top_logits, top_indices) = compute_topk(logits, topk, num_groups, group_topk);
      probs = torch::softmax(top_logits, -1);
    }
  } else {
    torch::Tensor scores = torch::sigmoid(logits);
    if (expert_bias.defined()) {
      top_indices =
          std::get<1>(compute_topk(scores + expert_bias.to(scores.scalar_type()), topk, num_groups, group_topk));
      scores = torch::gather(scores, 1, top_indices);
    } else {
      std::tie(scores, top_indices) = compute_topk(scores, topk, num_groups, group_topk);
    }
    probs = topk > 1 ? scores / (scores.sum(-1, /*keepdim=*/true) + 1e-20) : scores;
  }
  if (scaling_factor) probs = probs * *scaling_factor;
  return {torch::zeros_like(logits).scatter(1, top_indices, probs), map_of(logits, top_indices)};
}

Routing compute_routing_scores_for_aux_loss(const torch::Tensor& logits, int64_t topk,
                                            MoERouterScoreFunction score_function) {
  torch::Tensor scores;
  if (score_function == MoERouterScoreFunction::kSoftmax) {
    scores = torch::softmax(logits, -1);
  } else {
    scores = torch::sigmoid(logits);
    scores = scores / (scores.sum(-1, /*keepdim=*/true) + 1e-20);
  }
  const torch::Tensor top_indices = std::get<1>(torch::topk(scores, topk, /*dim=*/1));
  return {scores, map_of(logits, top_indices)};
}

torch::Tensor switch_load_balancing_loss_func(const torch::Tensor& probs, const torch::Tensor& tokens_per_expert,
                                              int64_t total_num_tokens, int64_t topk, int64_t num_experts,
                                              double coeff) {
  const torch::Tensor aggregated = probs.sum(0);
  const double t = static_cast<double>(total_num_tokens);
  return (aggregated * tokens_per_expert.to(aggregated.scalar_type())).sum() *
         (static_cast<double>(num_experts) * coeff / (static_cast<double>(topk) * t * t));
}

torch::Tensor z_loss_func(const torch::Tensor& logits, double coeff) {
  return torch::logsumexp(logits, -1).square().mean() * coeff;
}

int64_t get_capacity(int64_t num_tokens, int64_t num_experts, double capacity_factor) {
  const double capacity =
      std::ceil(static_cast<double>(num_tokens) / static_cast<double>(num_experts) * capacity_factor);
  return std::max<int64_t>(1, static_cast<int64_t>(capacity));
}

Routing apply_router_token_dropping(const Routing& routing, int64_t capacity, MoETokenDropPolicy drop_policy,
                                    bool pad_to_capacity) {
  const int64_t tokens = routing.probs.size(0);
  const int64_t keep = std::min(capacity, tokens);
  torch::Tensor capacity_mask;
  if (drop_policy == MoETokenDropPolicy::kProbs) {
    // Per expert (column), the `keep` highest probabilities; unrouted tokens have 0 and come last.
    const torch::Tensor indices = std::get<1>(torch::topk(routing.probs, keep, /*dim=*/0));
    capacity_mask = torch::zeros_like(routing.routing_map).scatter(0, indices, torch::ones_like(indices, torch::kBool));
  } else {
    // Per expert, its first `keep` tokens in order (the tail is dropped); padding takes the next unrouted ones.
    const torch::Tensor routed = routing.routing_map.to(torch::kLong);
    capacity_mask = routing.routing_map.logical_and(routed.cumsum(0) <= keep);
    if (pad_to_capacity) {
      const torch::Tensor missing = keep - capacity_mask.sum(0, /*keepdim=*/true);
      const torch::Tensor unrouted = routing.routing_map.logical_not();
      capacity_mask = capacity_mask.logical_or(unrouted.logical_and(unrouted.to(torch::kLong).cumsum(0) <= missing));
    }
  }
  const torch::Tensor map = pad_to_capacity ? capacity_mask : routing.routing_map.logical_and(capacity_mask);
  return {routing.probs * map.to(routing.probs.scalar_type()), map};
}

Permutation permute(const torch::Tensor& tokens, const torch::Tensor& probs, const torch::Tensor& routing_map) {
  const int64_t num_tokens = routing_map.size(0);
  const int64_t experts = routing_map.size(1);
  const torch::Tensor map_t = routing_map.t().contiguous();  // [E, T]: token order within each expert
  const torch::Tensor token_indices =
      torch::arange(num_tokens, routing_map.options().dtype(torch::kLong)).unsqueeze(0).expand({experts, num_tokens});
  Permutation out;
  out.sorted_indices = token_indices.masked_select(map_t);
  out.probs = probs.t().contiguous().masked_select(map_t);
  out.tokens = tokens.index_select(0, out.sorted_indices);
  out.tokens_per_expert = routing_map.sum(0).to(torch::kCPU, torch::kLong);
  return out;
}

torch::Tensor unpermute(const torch::Tensor& permuted, const torch::Tensor& sorted_indices, int64_t num_tokens) {
  return torch::zeros({num_tokens, permuted.size(1)}, permuted.options()).index_add(0, sorted_indices, permuted);
}

torch::Tensor attach_aux_loss(const torch::Tensor& output, const torch::Tensor& aux_loss) {
  return AuxLossAutoScaler::apply(output, aux_loss);
}

void set_aux_loss_backward_scale(double scale) { backward_scale().store(scale); }
double aux_loss_backward_scale() { return backward_scale().load(); }

double main_loss_backward_scale(double loss_scale, int64_t num_microbatches, int64_t context_parallel_size) {
  if (num_microbatches < 1 || context_parallel_size < 1) {
    throw std::invalid_argument("main_loss_backward_scale: num_microbatches (" + std::to_string(num_microbatches) +
                                ") and context_parallel_size (" + std::to_string(context_parallel_size) +
                                ") must be >= 1");
  }
  return loss_scale * static_cast<double>(context_parallel_size) / static_cast<double>(num_microbatches);
}

torch::Tensor get_updated_expert_bias(const torch::Tensor& tokens_per_expert, const torch::Tensor& expert_bias,
                                      double update_rate) {
  torch::NoGradGuard no_grad;
  const torch::Tensor tokens = tokens_per_expert.to(expert_bias.scalar_type());
  const torch::Tensor offset = tokens.mean(-1, /*keepdim=*/true) - tokens;
  return expert_bias + torch::sign(offset) * update_rate;
}

}  // namespace bridge::models::moe
