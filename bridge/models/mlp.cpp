// The MLP: fc1 column-parallel, the activation, fc2 row-parallel.
#include "bridge/models/mlp.h"

#include <cmath>

#include "bridge/models/transformer_layer.h"
#include "parallel/parallel_state.h"

namespace bridge::models {
namespace tp = parallel::tensor_parallel;

torch::Tensor mlp_activation(const torch::Tensor& fc1_output, ActivationFunc activation_func, bool gated) {
  const auto activation = [&](const torch::Tensor& x) {
    switch (activation_func) {
      case ActivationFunc::kOpenaiGelu:
        return torch::gelu(x, "tanh");
      case ActivationFunc::kSilu:
        return torch::silu(x);
      case ActivationFunc::kGelu:
        break;
    }
    return torch::gelu(x);
  };
  if (!gated) return activation(fc1_output);
  const int64_t half = fc1_output.size(-1) / 2;
  return activation(fc1_output.narrow(-1, 0, half)) * fc1_output.narrow(-1, half, half);
}

MLPImpl::MLPImpl(const GPTConfig& config, const std::string& prefix, int64_t ffn_hidden_size)
    : activation_func_(config.activation_func), gated_(config.gated_linear_unit) {
  const int64_t ffn = ffn_hidden_size > 0 ? ffn_hidden_size : config.ffn_size();
  const bool sequence_parallel = uses_sequence_parallel(config, parallel::get_tensor_model_parallel_world_size());
  // Gated: the master fc1 is [gate; up]; stride 2 gives each rank its rows of both.
  tp::ColumnParallelLinearOptions fc1(config.hidden_size, (gated_ ? 2 : 1) * ffn);
  fc1.stride = gated_ ? 2 : 1;
  fc1.bias = config.add_bias_linear;
  fc1.gradient_accumulation_fusion = config.gradient_accumulation_fusion;
  fc1.sequence_parallel = sequence_parallel;
  fc1.init_method = init_method_for(config, prefix + "linear_fc1.weight", config.init_method_std);
  linear_fc1 = register_module("linear_fc1", tp::ColumnParallelLinear(fc1));
  tp::RowParallelLinearOptions fc2(ffn, config.hidden_size);
  fc2.bias = config.add_bias_linear;
  fc2.gradient_accumulation_fusion = config.gradient_accumulation_fusion;
  fc2.sequence_parallel = sequence_parallel;
  fc2.init_method = init_method_for(config, prefix + "linear_fc2.weight",
                                    config.init_method_std / std::sqrt(2.0 * static_cast<double>(config.num_layers)));
  linear_fc2 = register_module("linear_fc2", tp::RowParallelLinear(fc2));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& hidden_states) {
  return linear_fc2(mlp_activation(linear_fc1(hidden_states), activation_func_, gated_));
}

}  // namespace bridge::models
