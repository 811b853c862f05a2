// SharedExpertMLP: the dense MLP every token of an MoE layer also takes, with its optional sigmoid gate.
#include "bridge/models/moe/shared_experts.h"

#include "bridge/models/transformer_layer.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"

namespace bridge::models::moe {
namespace tp = parallel::tensor_parallel;

SharedExpertMLPImpl::SharedExpertMLPImpl(const GPTConfig& config, const std::string& prefix)
    : MLPImpl(config, prefix, *config.moe_shared_expert_intermediate_size) {
  if (!config.moe_shared_expert_gate) return;
  torch::Tensor master = torch::empty({1, config.hidden_size});
  init_method_for(config, prefix + "gate_weight", config.init_method_std)(master);
  gate_weight = register_parameter("gate_weight", master);
  // Applied to this rank's part of the sequence under sequence parallelism: a partial gradient, summed over the
  // tensor-parallel group (Megatron-Core gives it the sequence_parallel attribute).
  if (uses_sequence_parallel(config, parallel::get_tensor_model_parallel_world_size())) {
    tp::ParamAttributes attributes = tp::get_param_attributes(gate_weight);
    attributes.sequence_parallel = true;
    tp::set_param_attributes(gate_weight, attributes);
  }
}

torch::Tensor SharedExpertMLPImpl::forward(const torch::Tensor& hidden_states) {
  torch::Tensor output = MLPImpl::forward(hidden_states);
  if (gate_weight.defined()) {
    output = output * torch::sigmoid(torch::matmul(hidden_states, gate_weight.t()));
  }
  return output;
}

}  // namespace bridge::models::moe
