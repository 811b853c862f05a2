// TopKRouter: the gate in fp32, Megatron-Core's routing, capacity dropping and the auxiliary losses.
#include "bridge/models/moe/router.h"

#include "bridge/models/moe/moe_logging.h"
#include "bridge/models/transformer_layer.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"

namespace bridge::models::moe {
namespace tp = parallel::tensor_parallel;

TopKRouterImpl::TopKRouterImpl(const GPTConfig& config, int64_t layer_number)
    : config_(config),
      layer_number_(layer_number),
      router_dtype_(config.moe_router_dtype == MoERouterDtype::kFp64 ? torch::kDouble : torch::kFloat) {
  const int64_t experts = *config.num_moe_experts;
  torch::Tensor master = torch::empty({experts, config.hidden_size});
  init_method_for(config, "decoder.layers." + std::to_string(layer_number) + ".mlp.router.weight",
                  config.init_method_std)(master);
  weight = register_parameter("weight", master);
  // Each tensor-parallel rank routes its own part of the sequence: the gate's gradient is partial, summed over the
  // group in finalize_model_grads (Megatron-Core gives the router weight the sequence_parallel attribute).
  if (uses_sequence_parallel(config, parallel::get_tensor_model_parallel_world_size())) {
    tp::ParamAttributes attributes = tp::get_param_attributes(weight);
    attributes.sequence_parallel = true;
    tp::set_param_attributes(weight, attributes);
  }
  if (config.moe_router_enable_expert_bias) {
    expert_bias = register_buffer("expert_bias", torch::zeros({experts}, torch::kFloat));
  }
  local_tokens_per_expert = torch::zeros({experts}, torch::kFloat);
}

torch::Tensor TopKRouterImpl::gating(const torch::Tensor& hidden_states) const {
  const torch::Tensor tokens = hidden_states.reshape({-1, hidden_states.size(-1)});
  return torch::matmul(tokens.to(router_dtype_), weight.to(router_dtype_).t());
}

torch::Tensor TopKRouterImpl::apply_z_loss(torch::Tensor logits) {
  if (!config_.moe_z_loss_coeff || *config_.moe_z_loss_coeff <= 0.0) return logits;
  // Megatron-Core divides the coefficient by the tensor x context-parallel size: the ranks' losses (each over its
  // tokens) add.
  const double coeff = *config_.moe_z_loss_coeff / parallel::get_tensor_and_context_parallel_world_size();
  const torch::Tensor z_loss = z_loss_func(logits, coeff);
  MoEMetricsTracker::get().record("z_loss", layer_number_, z_loss / coeff);
  return attach_aux_loss(logits, z_loss);
}

torch::Tensor TopKRouterImpl::apply_load_balancing_loss(const torch::Tensor& logits, torch::Tensor probs,
                                                        int64_t seq_length) {
  const double coeff = config_.moe_aux_loss_coeff;
  if (coeff <= 0.0 || config_.moe_router_load_balancing_type == MoELoadBalancingType::kNone) return probs;
  const int64_t k = config_.moe_router_topk;
  const int64_t experts = *config_.num_moe_experts;
  const Routing aux = compute_routing_scores_for_aux_loss(logits, k, config_.moe_router_score_function);
  // The ranks holding parts of the same sequences, as Megatron-Core's tp_cp group: the tensor-parallel ranks (under
  // sequence parallelism) and the context-parallel ones each route their own tokens. The counts are summed over them
  // and each rank's loss is its share: the shares add up to the loss of the whole sequences.
  parallel::ProcessGroup& tp_cp_group = parallel::get_tensor_and_context_parallel_group();
  const int64_t local_tokens = logits.size(0);
  torch::Tensor loss;
  std::string name;
  switch (config_.moe_router_load_balancing_type) {
    case MoELoadBalancingType::kAuxLoss: {
      torch::Tensor counts = aux.routing_map.sum(0).to(torch::kDouble);
      tp_cp_group.all_reduce(counts);
      loss = switch_load_balancing_loss_func(aux.probs, counts, local_tokens * tp_cp_group.size(), k, experts, coeff);
      name = "load_balancing_loss";
      break;
    }
    case MoELoadBalancingType::kSeqAuxLoss: {
      // Rows are [s, b] flattened: per sequence b, its s tokens' scores and counts ([s, b * E]).
      const int64_t batch = local_tokens / seq_length;
      const torch::Tensor scores = aux.probs.reshape({seq_length, -1});
      torch::Tensor counts = aux.routing_map.reshape({seq_length, -1}).sum(0).to(torch::kDouble);
      tp_cp_group.all_reduce(counts);
      loss = switch_load_balancing_loss_func(scores, counts, seq_length * tp_cp_group.size(), k, experts, coeff) /
             static_cast<double>(batch);
      name = "seq_load_balancing_loss";
      break;
    }
    case MoELoadBalancingType::kGlobalAuxLoss: {
      parallel::ProcessGroup& group = parallel::get_tensor_and_data_parallel_group(/*with_context_parallel=*/true);
      torch::Tensor counts = aux.routing_map.sum(0).to(torch::kDouble);
      group.all_reduce(counts);
      global_tokens_per_expert_ = global_tokens_per_expert_.defined() ? global_tokens_per_expert_ + counts : counts;
      ++global_aux_steps_;
      loss = switch_load_balancing_loss_func(aux.probs, global_tokens_per_expert_ / global_aux_steps_,
                                             local_tokens * group.size(), k, experts, coeff);
      name = "global_load_balancing_loss";
      break;
    }
    case MoELoadBalancingType::kNone:
      return probs;
  }
  MoEMetricsTracker::get().record(name, layer_number_, loss / coeff);
  return attach_aux_loss(probs, loss);
}

Routing TopKRouterImpl::forward(const torch::Tensor& hidden_states) {
  const bool training = is_training() && torch::GradMode::is_enabled();
  torch::Tensor logits = gating(hidden_states);
  if (training) logits = apply_z_loss(logits);
  Routing routing = topk_routing_with_score_function(logits, config_.moe_router_topk, config_.moe_router_pre_softmax,
                                                     config_.moe_router_num_groups, config_.moe_router_group_topk,
                                                     config_.moe_router_topk_scaling_factor,
                                                     config_.moe_router_score_function, expert_bias);
  int64_t dropped = 0;
  if (config_.moe_expert_capacity_factor) {
    const int64_t capacity =
        get_capacity(logits.size(0) * config_.moe_router_topk, logits.size(1), *config_.moe_expert_capacity_factor);
    const Routing kept = apply_router_token_dropping(routing, capacity, config_.moe_token_drop_policy,
                                                     config_.moe_pad_expert_input_to_capacity);
    if (training) dropped = routing.routing_map.logical_and(kept.routing_map.logical_not()).sum().item<int64_t>();
    routing = kept;
  }
  if (training) {
    routing.probs = apply_load_balancing_loss(logits, routing.probs, hidden_states.size(0));
    const torch::Tensor counts = routing.routing_map.sum(0);
    MoEMetricsTracker::get().record_tokens(layer_number_, counts, dropped);
    if (expert_bias.defined()) {
      torch::NoGradGuard no_grad;
      local_tokens_per_expert = local_tokens_per_expert.to(counts.device()) + counts.to(torch::kFloat);
    }
  }
  return routing;
}

void TopKRouterImpl::update_expert_bias(const torch::Tensor& tokens_per_expert) {
  torch::NoGradGuard no_grad;
  expert_bias.copy_(get_updated_expert_bias(tokens_per_expert.to(expert_bias.device()), expert_bias,
                                            config_.moe_router_bias_update_rate));
  local_tokens_per_expert.zero_();
}

void TopKRouterImpl::to(torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(dtype, non_blocking);
  if (expert_bias.defined()) expert_bias.set_data(expert_bias.to(torch::kFloat));
}

void TopKRouterImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  if (expert_bias.defined()) expert_bias.set_data(expert_bias.to(torch::kFloat));
  local_tokens_per_expert = local_tokens_per_expert.to(device);
}

void TopKRouterImpl::reset_global_tokens() {
  global_tokens_per_expert_ = torch::Tensor();
  global_aux_steps_ = 0;
}

}  // namespace bridge::models::moe
