// RoPE's frequencies (with Llama 3.1's or YaRN's scaling) and their application to queries and keys, in the halves'
// layout or the interleaved one.
#include "bridge/models/rotary_pos_embedding.h"

#include <algorithm>
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

// YaRN (transformers' _compute_yarn_parameters, Megatron-Core's YarnRotaryEmbedding.get_emb), in their order of
// operations so that the frequencies are theirs to the bit: the dimension at which a frequency makes `rotations` turns
// over the original context is d(r) = dim ln(original / (2 pi r)) / (2 ln base); below d(beta_fast) the frequency is
// kept (extrapolated), above d(beta_slow) divided by the factor (interpolated), linearly blended between.
torch::Tensor yarn_scaled(const torch::Tensor& powers, const GPTConfig& config) {
  const int64_t dim = config.rotary_dim();
  const double factor = config.yarn_rotary_scaling_factor, base = config.rotary_base;
  const double original = static_cast<double>(config.yarn_original_max_position_embeddings);
  const auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(base));
  };
  double low = correction_dim(config.yarn_beta_fast), high = correction_dim(config.yarn_beta_slow);
  if (config.yarn_correction_range_round_to_int) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // both references' guard against a zero-width ramp
  const torch::Tensor ramp = ((torch::arange(dim / 2, torch::kFloat32) - low) / (high - low)).clamp(0, 1);
  const torch::Tensor extrapolated = 1 - ramp;  // the share of each frequency kept as it is
  const torch::Tensor inv_freq_extrapolation = 1.0 / powers;
  const torch::Tensor inv_freq_interpolation = 1.0 / (factor * powers);
  return inv_freq_interpolation * (1 - extrapolated) + inv_freq_extrapolation * extrapolated;
}

double get_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// The scalings, one row each: which one a config has, and the frequencies and attention factor it gives from the
// powers base^(2i / dim).
struct Scaling {
  bool (*applies)(const GPTConfig&);
  torch::Tensor (*inv_freq)(const torch::Tensor& powers, const GPTConfig&);
  double (*attention_factor)(const GPTConfig&);
};
const Scaling kScalings[] = {
    {[](const GPTConfig& c) { return c.position_embedding_type == PositionEmbeddingType::kYarn; }, yarn_scaled,
     yarn_attention_factor},
    {[](const GPTConfig& c) { return c.rope_scaling; },
     [](const torch::Tensor& powers, const GPTConfig& c) { return llama3_scaled(1.0 / powers, c); },
     [](const GPTConfig&) { return 1.0; }},
    {[](const GPTConfig&) { return true; }, [](const torch::Tensor& powers, const GPTConfig&) { return 1.0 / powers; },
     [](const GPTConfig&) { return 1.0; }},
};

}  // namespace

double yarn_attention_factor(const GPTConfig& config) {
  if (config.yarn_attention_factor) return *config.yarn_attention_factor;
  const double factor = config.yarn_rotary_scaling_factor;
  return get_mscale(factor, config.yarn_mscale) / get_mscale(factor, config.yarn_mscale_all_dim);
}

RotaryEmbedding::RotaryEmbedding(const GPTConfig& config) {
  const int64_t dim = config.rotary_dim();
  // As the references compute it: the exponents in fp32, the power of a double base.
  const torch::Tensor exponents =
      torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(dim);
  const torch::Tensor powers = torch::pow(config.rotary_base, exponents);
  const Scaling& scaling = *std::find_if(std::begin(kScalings), std::end(kScalings),
                                         [&](const Scaling& candidate) { return candidate.applies(config); });
  inv_freq_ = scaling.inv_freq(powers, config);
  attention_factor_ = scaling.attention_factor(config);
  interleaved_ = config.rotary_interleaved;
}

RotaryTables RotaryEmbedding::tables(const torch::Tensor& position_ids) const {
  const torch::Tensor inv_freq = inv_freq_.to(position_ids.device());
  // [b, s, dim / 2]: each position times each frequency, in fp32 whatever the model's dtype.
  const torch::Tensor freqs = position_ids.to(torch::kFloat32).unsqueeze(-1) * inv_freq;
  // [b, 1, s, dim]: each frequency at both channels of its pair.
  const torch::Tensor emb =
      (interleaved_ ? freqs.repeat_interleave(2, -1) : torch::cat({freqs, freqs}, -1)).unsqueeze(1);
  if (attention_factor_ == 1.0) return {emb.cos(), emb.sin(), interleaved_};
  // YaRN: transformers and Megatron-Core both scale the fp32 tables, so q.k grows by the factor squared.
  return {emb.cos() * attention_factor_, emb.sin() * attention_factor_, interleaved_};
}

torch::Tensor apply_rotary_pos_emb(const torch::Tensor& t, const RotaryTables& tables) {
  const int64_t dim = tables.cos.size(-1);
  const torch::Tensor rotated = t.narrow(-1, 0, dim);
  torch::Tensor half_turned;  // each pair's partner with the sign that makes x * cos + it * sin the rotation
  if (tables.interleaved) {
    const torch::Tensor even = rotated.slice(-1, 0, dim, 2), odd = rotated.slice(-1, 1, dim, 2);
    half_turned = torch::stack({-odd, even}, -1).flatten(-2);  // [-x1, x0, -x3, x2, ...]
  } else {
    const torch::Tensor x1 = rotated.narrow(-1, 0, dim / 2), x2 = rotated.narrow(-1, dim / 2, dim / 2);
    half_turned = torch::cat({-x2, x1}, -1);
  }
  const torch::Tensor cos = tables.cos.to(t.scalar_type()), sin = tables.sin.to(t.scalar_type());
  torch::Tensor out = rotated * cos + half_turned * sin;
  if (dim == t.size(-1)) return out;
  return torch::cat({out, t.narrow(-1, dim, t.size(-1) - dim)}, -1);
}

}  // namespace bridge::models
