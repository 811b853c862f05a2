// MoELayer: route, dispatch, run the local experts, combine, add the shared experts.
#include "bridge/models/moe/moe_layer.h"

#include <string>

#include "parallel/tensor_parallel/random.h"

namespace bridge::models::moe {
namespace tp = parallel::tensor_parallel;

MoELayerImpl::MoELayerImpl(const GPTConfig& config, int64_t layer_number)
    : token_dispatcher_(make_token_dispatcher(config)), recompute_shared_experts_(config.recomputes("shared_experts")) {
  router = register_module("router", TopKRouter(config, layer_number));
  experts = register_module("experts", SequentialMLP(config, layer_number));
  if (config.moe_shared_expert_intermediate_size) {
    shared_experts = register_module(
        "shared_experts",
        SharedExpertMLP(config, "decoder.layers." + std::to_string(layer_number) + ".mlp.shared_experts."));
  }
}

torch::Tensor MoELayerImpl::forward(const torch::Tensor& hidden_states) {
  torch::Tensor shared;
  if (shared_experts) {
    shared = is_training() && recompute_shared_experts_
                 ? tp::checkpoint(
                       [this](const torch::autograd::variable_list& in) {
                         return torch::autograd::variable_list{shared_experts(in[0])};
                       },
                       {hidden_states})[0]
                 : shared_experts(hidden_states);
  }
  const Routing routing = router(hidden_states);
  const torch::Tensor tokens = hidden_states.reshape({-1, hidden_states.size(-1)});
  const DispatchedTokens dispatched = token_dispatcher_->dispatch(tokens, routing);
  const torch::Tensor expert_output = experts(dispatched.tokens, dispatched.tokens_per_expert);
  torch::Tensor output = token_dispatcher_->combine(expert_output).view(hidden_states.sizes());
  return shared.defined() ? output + shared : output;
}

}  // namespace bridge::models::moe
