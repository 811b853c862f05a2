// ExpertLoadMonitor: how evenly an MoE model's routers spread the tokens, in the log record at every log step. For
// each MoE layer i, from the last step's tokens per expert over the whole job (GlobalState::moe_report):
// "moe/expert_load_imbalance_layer_<i>" (the busiest expert's tokens over the mean: 1 is perfectly balanced, E means
// one expert took everything) and "moe/dropped_tokens_layer_<i>" (tokens past an expert's capacity, with
// model.moe_expert_capacity_factor); and over the layers "moe/expert_load_imbalance" (the worst layer) and
// "moe/dropped_tokens" (their sum). With model.moe_per_layer_logging also each auxiliary loss per layer,
// "moe/<name>_layer_<i>", as Megatron writes them. Nothing for a dense model.
//
//   manager->add(std::make_shared<ExpertLoadMonitor>());
#pragma once

#include "training/callbacks/callback.h"

namespace bridge::training {
inline namespace callbacks {

class ExpertLoadMonitor : public Callback {
 public:
  void on_log(CallbackContext& ctx) override;
};

}  // namespace callbacks
}  // namespace bridge::training
