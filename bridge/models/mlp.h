// The transformer layer's MLP (Megatron-Core's transformer/mlp.py): fc1 column-parallel, then GeLU (exact or tanh)
// or SiLU; with gated_linear_unit fc1 is [gate; up] (each rank holds its rows of both) and the output
// act(gate) * up; fc2 row-parallel. The shared experts of an MoE layer are this MLP at their own width.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "bridge/models/gpt_config.h"
#include "parallel/tensor_parallel/layers.h"

namespace bridge::models {

/// The MLP's activation on fc1's output: act(x), or with `gated` act(gate) * up of x = [gate, up] (last dim).
torch::Tensor mlp_activation(const torch::Tensor& fc1_output, ActivationFunc activation_func, bool gated);

class MLPImpl : public torch::nn::Module {
 public:
  /// `ffn_hidden_size` > 0 overrides the config's width (Megatron-Core's shared experts are an MLP of their own width).
  MLPImpl(const GPTConfig& config, const std::string& prefix, int64_t ffn_hidden_size = 0);
  torch::Tensor forward(const torch::Tensor& hidden_states);

  parallel::tensor_parallel::ColumnParallelLinear linear_fc1{nullptr};
  parallel::tensor_parallel::RowParallelLinear linear_fc2{nullptr};

 private:
  ActivationFunc activation_func_;
  bool gated_;
};
TORCH_MODULE(MLP);

}  // namespace bridge::models
