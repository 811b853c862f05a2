// Norm: the model's LayerNorm or RMSNorm (Megatron-Core's config.normalization, as its WrappedTorchNorm builds one),
// over the last dimension. The parameters are named as torch::nn::LayerNorm's ("weight", and "bias" for LayerNorm
// only), so checkpoints keep Megatron-Core's names: input_layernorm.weight, ..., q_layernorm.weight.
//
//   Norm norm(Normalization::kRMSNorm, /*size=*/4096, /*eps=*/1e-5);
//   torch::Tensor y = norm(x);  // x: [..., 4096]
#pragma once

#include <torch/torch.h>

#include "bridge/models/gpt_config.h"

namespace bridge::models {

class NormImpl : public torch::nn::Module {
 public:
  NormImpl(Normalization normalization, int64_t size, double eps);
  torch::Tensor forward(const torch::Tensor& input);

  torch::Tensor weight;  ///< ones at initialisation
  torch::Tensor bias;    ///< zeros at initialisation; undefined for RMSNorm

 private:
  Normalization normalization_;
  int64_t size_;
  double eps_;
};
TORCH_MODULE(Norm);

/// RMSNorm of `input` over its last dimension: input / sqrt(mean(input^2) + eps) * weight, normalised in fp32 and
/// cast back to input's dtype before the scale (as transformers' LlamaRMSNorm and ATen's rms_norm).
torch::Tensor rms_norm(const torch::Tensor& input, const torch::Tensor& weight, double eps);

}  // namespace bridge::models
