// RoPE's frequencies (with Llama 3.1's scaling) and their application to queries and keys.
#include "bridge/models/rotary_pos_embedding.h"

#include <cmath>

namespace bridge::models {
namespace {

// Llama 3.1's scaling (transformers' _compute_llama3_parameters, Megatron-Core's _apply_scaling): wavelengths shorter
// than original / high_freq_factor keep their frequency, longer than original / low_freq_factor are divided by
// factor, and those between are blended smoothly.
torch::Tensor llama3_scaled(const torch::Tensor& inv_freq, const GPTConfig& config) {
  const double original = static_cast<double>(config.rope_scaling_original_max_position_embeddings);
  const double low = config.rope_scaling_low_freq_factor, high = config.rope_scaling_high_freq_factor;
  const double factor = config.rope_scaling_factor;
  const torch::Tensor wavelen = 2 * M_PI / inv_freq;
  torch::Tensor scaled = torch::where(wavelen > original / low, inv_freq / factor, inv_freq);
  const torch::Tensor smooth = (original / wavelen - low) / (high - low);
  const torch::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  const torch::Tensor medium = (wavelen >= original / high).logical_and(wavelen <= original / low);
  return torch::where(medium, smoothed, scaled);
}

}  // namespace

RotaryEmbedding::RotaryEmbedding(const GPTConfig& config) {
  const int64_t dim = config.rotary_dim();
  // As both references compute it: the exponents in fp32, the power of a double base.
  const torch::Tensor exponents =
      torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(dim);
  inv_freq_ = 1.0 / torch::pow(config.rotary_base, exponents);
  if (config.rope_scaling) inv_freq_ = llama3_scaled(inv_freq_, config);
}

RotaryTables RotaryEmbedding::tables(const torch::Tensor& position_ids) const {
  const torch::Tensor inv_freq = inv_freq_.to(position_ids.device());
  // [b, s, dim / 2]: each position times each frequency, in fp32 whatever the model's dtype.
  const torch::Tensor freqs = position_ids.to(torch::kFloat32).unsqueeze(-1) * inv_freq;
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);  // [b, 1, s, dim]
  return {emb.cos(), emb.sin()};
}

torch::Tensor apply_rotary_pos_emb(const torch::Tensor& t, const RotaryTables& tables) {
  const int64_t dim = tables.cos.size(-1);
  const torch::Tensor rotated = t.narrow(-1, 0, dim);
  const torch::Tensor x1 = rotated.narrow(-1, 0, dim / 2), x2 = rotated.narrow(-1, dim / 2, dim / 2);
  const torch::Tensor cos = tables.cos.to(t.scalar_type()), sin = tables.sin.to(t.scalar_type());
  torch::Tensor out = rotated * cos + torch::cat({-x2, x1}, -1) * sin;
  if (dim == t.size(-1)) return out;
  return torch::cat({out, t.narrow(-1, dim, t.size(-1) - dim)}, -1);
}

}  // namespace bridge::models
