// The routed experts of one MoE layer on this rank (Megatron-Core's SequentialMLP, under its names: local_experts.<k>
// with linear_fc1 and linear_fc2, k the local index): expert-parallel rank r holds the experts
// r * E / ep ... (r + 1) * E / ep - 1, each an MLP of width moe_ffn_hidden_size split over the expert
// tensor-parallel ranks (fc1 by rows, [gate; up] each split, fc2 by columns). The tokens arrive grouped by expert;
// each expert runs one matrix product per weight over its contiguous slice, never a loop over tokens. No
// communication here: the token dispatcher gathers and reduces around the experts (Megatron's explicit_expert_comm).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "bridge/models/gpt_config.h"

namespace bridge::models::moe {

/// One expert's weight: a module with a single `weight` parameter, so the state dict names are Megatron-Core's
/// (local_experts.<k>.linear_fc1.weight).
class ExpertLinearImpl : public torch::nn::Module {
 public:
  ExpertLinearImpl(torch::Tensor weight_shard, bool gradient_accumulation_fusion);
  torch::Tensor forward(const torch::Tensor& input);
  torch::Tensor weight;

 private:
  bool gradient_accumulation_fusion_;
};
TORCH_MODULE(ExpertLinear);

class ExpertMLPImpl : public torch::nn::Module {
 public:
  ExpertMLPImpl(torch::Tensor fc1_shard, torch::Tensor fc2_shard, bool gradient_accumulation_fusion);
  ExpertLinear linear_fc1{nullptr};
  ExpertLinear linear_fc2{nullptr};
};
TORCH_MODULE(ExpertMLP);

class SequentialMLPImpl : public torch::nn::Module {
 public:
  /// `layer_number`: the layer's global index; each expert's master weights are drawn from the seed of its global
  /// name (decoder.layers.<n>.mlp.experts.local_experts.<global expert>.linear_fc1.weight), so every ep/etp layout
  /// starts from the same experts.
  SequentialMLPImpl(const GPTConfig& config, int64_t layer_number);

  /// `tokens`: [N, h], grouped by local expert; `tokens_per_expert`: N split per local expert (CPU int64). Returns
  /// [N, h], each row its expert's output (a partial sum over the expert tensor-parallel ranks when etp > 1).
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& tokens_per_expert);

  int64_t num_local_experts() const { return num_local_experts_; }
  /// The global index of local expert 0 (ep_rank * num_local_experts).
  int64_t first_expert() const { return first_expert_; }

  torch::nn::ModuleList local_experts;

 private:
  int64_t num_local_experts_;
  int64_t first_expert_;
  ActivationFunc activation_func_;
  bool gated_;
};
TORCH_MODULE(SequentialMLP);

}  // namespace bridge::models::moe
