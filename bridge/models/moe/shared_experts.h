// Shared experts (Megatron-Core's SharedExpertMLP): an ordinary tensor-parallel MLP of width
// moe_shared_expert_intermediate_size that every token goes through besides its routed experts, optionally scaled per
// token by sigmoid(x . gate_weight) (Qwen2-MoE's shared_expert_gate).
#pragma once

#include <torch/torch.h>

#include <string>

#include "bridge/models/gpt_config.h"
#include "bridge/models/mlp.h"

namespace bridge::models::moe {

class SharedExpertMLPImpl : public MLPImpl {
 public:
  /// `prefix`: "decoder.layers.<n>.mlp.shared_experts." (names and seeds the weights).
  SharedExpertMLPImpl(const GPTConfig& config, const std::string& prefix);
  torch::Tensor forward(const torch::Tensor& hidden_states);

  torch::Tensor gate_weight;  ///< [1, h] with moe_shared_expert_gate, else undefined
};
TORCH_MODULE(SharedExpertMLP);

}  // namespace bridge::models::moe
