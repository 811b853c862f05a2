// LayerNorm through ATen's fused kernel; RMSNorm through ATen's (LibTorch 2.4 and later) or, on 1.13, composed.
#include "bridge/models/normalization.h"

#include <torch/version.h>

namespace bridge::models {

NormImpl::NormImpl(Normalization normalization, int64_t size, double eps)
    : normalization_(normalization), size_(size), eps_(eps) {
  weight = register_parameter("weight", torch::ones({size}));
  if (normalization == Normalization::kLayerNorm) bias = register_parameter("bias", torch::zeros({size}));
}

torch::Tensor NormImpl::forward(const torch::Tensor& input) {
  if (normalization_ == Normalization::kLayerNorm) return at::layer_norm(input, {size_}, weight, bias, eps_);
  return rms_norm(input, weight, eps_);
}

torch::Tensor rms_norm(const torch::Tensor& input, const torch::Tensor& weight, double eps) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return at::rms_norm(input, {input.size(-1)}, weight, eps);
#else
  const torch::Tensor x = input.to(torch::kFloat32);
  // ATen's order: normalised in fp32, back to the input's dtype, then scaled.
  return (x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(input.scalar_type()) * weight;
#endif
}

}  // namespace bridge::models
