// The MoE fields' rules: Megatron-Core's TransformerConfig checks (and the MoE layer's own), with exit-2 messages
// that name the field and the fix.
#include "bridge/models/moe/moe_config.h"

#include <stdexcept>
#include <string>

#include "bridge/models/gpt_config.h"
#include "utils/check.h"

namespace bridge::models {
namespace {

using utils::require;

std::string str(int64_t value) { return std::to_string(value); }

}  // namespace

bool is_moe_layer(const GPTConfig& config, int64_t layer) {
  if (!config.num_moe_experts) return false;
  const MoELayerFreq& freq = config.moe_layer_freq;
  if (!freq.pattern.empty()) {
    return layer < static_cast<int64_t>(freq.pattern.size()) && freq.pattern[static_cast<std::size_t>(layer)] != 0;
  }
  return freq.every >= 1 && layer % freq.every == 0;
}

int64_t num_moe_layers(const GPTConfig& config) {
  int64_t count = 0;
  for (int64_t layer = 0; layer < config.num_layers; ++layer) count += is_moe_layer(config, layer) ? 1 : 0;
  return count;
}

void validate_moe(const GPTConfig& config, int tensor_model_parallel_size, int expert_model_parallel_size,
                  int expert_tensor_parallel_size) {
  const int64_t ep = expert_model_parallel_size;
  const int64_t etp = expert_tensor_parallel_size > 0 ? expert_tensor_parallel_size : tensor_model_parallel_size;
  if (!config.num_moe_experts) {
    require(ep == 1, "parallelism.expert_model_parallel_size is " + str(ep) +
                         " but the model has no experts; set model.num_moe_experts or expert_model_parallel_size: 1");
    return;
  }
  const int64_t experts = *config.num_moe_experts;
  require(experts >= 1, "model.num_moe_experts must be >= 1 (null for a dense model), got " + str(experts));
  require(experts % ep == 0, "model.num_moe_experts (" + str(experts) +
                                 ") must be divisible by parallelism.expert_model_parallel_size (" + str(ep) +
                                 "): each expert-parallel rank holds the same number of experts");
  const MoELayerFreq& freq = config.moe_layer_freq;
  if (freq.pattern.empty()) {
    require(freq.every >= 1, "model.moe_layer_freq must be >= 1 (1 = every layer is MoE), got " + str(freq.every));
  } else {
    require(static_cast<int64_t>(freq.pattern.size()) == config.num_layers,
            "model.moe_layer_freq is a list of " + str(static_cast<int64_t>(freq.pattern.size())) +
                " entries; it needs one 0 or 1 per layer (model.num_layers is " + str(config.num_layers) + ")");
    for (int64_t value : freq.pattern) {
      require(value == 0 || value == 1,
              "model.moe_layer_freq's entries must be 0 (dense) or 1 (MoE), got " + str(value));
    }
  }
  require(config.moe_ffn_size() >= 1, "model.moe_ffn_hidden_size must be >= 1, got " + str(config.moe_ffn_size()));
  require(config.moe_ffn_size() % etp == 0, "model.moe_ffn_hidden_size (" + str(config.moe_ffn_size()) +
                                                ") must be divisible by the expert tensor-parallel size (" + str(etp) +
                                                "); set parallelism.expert_tensor_parallel_size to a divisor of it");
  const int64_t k = config.moe_router_topk;
  require(k >= 1 && k <= experts,
          "model.moe_router_topk must be between 1 and model.num_moe_experts (" + str(experts) + "), got " + str(k));
  const bool softmax = config.moe_router_score_function == MoERouterScoreFunction::kSoftmax;
  require(!(k == 1 && softmax && !config.moe_router_pre_softmax),
          "model.moe_router_topk is 1 with the softmax score function, whose probability over one chosen logit is "
          "always 1 (the router would get no gradient); set model.moe_router_pre_softmax: true, as Megatron-Core "
          "requires");
  require(!config.moe_router_enable_expert_bias || !softmax,
          "model.moe_router_enable_expert_bias needs model.moe_router_score_function: sigmoid (Megatron-Core's "
          "auxiliary-loss-free balancing is defined for sigmoid scores)");
  require(config.moe_router_bias_update_rate >= 0.0, "model.moe_router_bias_update_rate must be >= 0");
  require(config.moe_router_num_groups.has_value() == config.moe_router_group_topk.has_value(),
          "model.moe_router_num_groups and model.moe_router_group_topk go together: set both (group-limited "
          "routing) or neither");
  if (config.moe_router_num_groups) {
    const int64_t groups = *config.moe_router_num_groups;
    const int64_t group_topk = *config.moe_router_group_topk;
    require(groups >= 1 && experts % groups == 0, "model.moe_router_num_groups (" + str(groups) +
                                                      ") must divide model.num_moe_experts (" + str(experts) + ")");
    require(group_topk >= 1 && group_topk <= groups, "model.moe_router_group_topk (" + str(group_topk) +
                                                         ") must be between 1 and model.moe_router_num_groups (" +
                                                         str(groups) + ")");
    require(k % group_topk == 0 && k / group_topk <= experts / groups,
            "model.moe_router_topk (" + str(k) + ") must be a multiple of model.moe_router_group_topk (" +
                str(group_topk) +
                ") and pick at most a group's experts per group: each chosen group scores by its "
                "best topk / group_topk experts");
  }
  if (config.moe_router_topk_scaling_factor) {
    require(*config.moe_router_topk_scaling_factor > 0.0, "model.moe_router_topk_scaling_factor must be > 0");
  }
  require(config.moe_aux_loss_coeff >= 0.0, "model.moe_aux_loss_coeff must be >= 0 (Megatron suggests 1e-2)");
  if (config.moe_z_loss_coeff) {
    require(*config.moe_z_loss_coeff >= 0.0, "model.moe_z_loss_coeff must be >= 0 (Megatron suggests 1e-3)");
  }
  if (config.moe_expert_capacity_factor) {
    require(*config.moe_expert_capacity_factor > 0.0,
            "model.moe_expert_capacity_factor must be > 0; leave it null for dropless routing");
  }
  require(!config.moe_pad_expert_input_to_capacity || config.moe_expert_capacity_factor.has_value(),
          "model.moe_pad_expert_input_to_capacity needs model.moe_expert_capacity_factor (the capacity to pad to)");
  if (config.moe_shared_expert_intermediate_size) {
    const int64_t shared = *config.moe_shared_expert_intermediate_size;
    require(shared >= 1 && shared % tensor_model_parallel_size == 0,
            "model.moe_shared_expert_intermediate_size (" + str(shared) +
                ") must be >= 1 and divisible by the tensor-parallel size (" + str(tensor_model_parallel_size) + ")");
  }
  require(!config.moe_shared_expert_gate || config.moe_shared_expert_intermediate_size.has_value(),
          "model.moe_shared_expert_gate needs shared experts: set model.moe_shared_expert_intermediate_size");
  require(!config.add_bias_linear,
          "model.add_bias_linear must be false with model.num_moe_experts: bridge's experts and router have no biases "
          "(Qwen-MoE, Mixtral and OLMoE have none)");
  require(tensor_model_parallel_size == 1 || config.sequence_parallel,
          "an MoE model at tensor_model_parallel_size " + str(tensor_model_parallel_size) +
              " needs model.sequence_parallel: true, as Megatron-Core requires (the token dispatchers work on each "
              "rank's part of the sequence)");
  require(config.moe_token_dispatcher_type != MoETokenDispatcherType::kAlltoall || etp == 1,
          "model.moe_token_dispatcher_type alltoall runs experts at expert_tensor_parallel_size 1 in bridge; set "
          "parallelism.expert_tensor_parallel_size: 1 or use the allgather dispatcher");
}

}  // namespace bridge::models
