// The MoE layer (Megatron-Core's MoELayer), the MLP of a transformer layer that moe_layer_freq marks: shared experts
// (if any) on every token, the router, the token dispatcher, this rank's experts, the combine, plus the shared
// output. Activations [s, b, h] as the dense MLP's ([s / tp, b, h] under sequence parallelism).
#pragma once

#include <torch/torch.h>

#include <memory>

#include "bridge/models/gpt_config.h"
#include "bridge/models/moe/experts.h"
#include "bridge/models/moe/router.h"
#include "bridge/models/moe/shared_experts.h"
#include "bridge/models/moe/token_dispatcher.h"

namespace bridge::models::moe {

class MoELayerImpl : public torch::nn::Module {
 public:
  /// `layer_number`: the layer's global index.
  MoELayerImpl(const GPTConfig& config, int64_t layer_number);
  torch::Tensor forward(const torch::Tensor& hidden_states);

  TopKRouter router{nullptr};
  SequentialMLP experts{nullptr};
  SharedExpertMLP shared_experts{nullptr};  ///< with moe_shared_expert_intermediate_size

 private:
  std::unique_ptr<MoETokenDispatcher> token_dispatcher_;
  bool recompute_shared_experts_;
};
TORCH_MODULE(MoELayer);

}  // namespace bridge::models::moe
