// estimate_memory: the parameter count of the first and last pipeline stage from the model's shape, the bytes per
// parameter of the precision and optimizer, and the activations of Megatron's theoretical memory report.
#include "training/utils/theoretical_memory.h"

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "bridge/models/moe/moe_config.h"
#include "parallel/tensor_parallel/vocab_utils.h"
#include "training/config/config.h"

namespace bridge::training::utils {

namespace {

// A norm's parameters over `size` channels: LayerNorm's weight and bias, RMSNorm's weight.
double norm_parameters(const models::GPTConfig& m, double size) {
  return m.normalization == models::Normalization::kLayerNorm ? 2 * size : size;
}

// One layer's parameters: those split over tensor-parallel ranks (QKV, the projection, the MLP's weights or an MoE
// layer's shared experts, the column-parallel biases), those every rank holds (the row-parallel biases, the norms, an
// MoE router and shared-expert gate) and an MoE layer's routed experts, split over expert tensor x expert parallel.
struct LayerParameters {
  double split = 0;
  double replicated = 0;
  double experts = 0;
};

double mlp_weights(const models::GPTConfig& m, double ffn, double h) {
  return h * (m.gated_linear_unit ? 2 : 1) * ffn + ffn * h;
}

LayerParameters layer_parameters(const models::GPTConfig& m, bool moe) {
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn_size());
  const double qkv = static_cast<double>(m.qkv_size()), proj = static_cast<double>(m.query_projection_size());
  const double fc1 = (m.gated_linear_unit ? 2 : 1) * f;
  LayerParameters layer;
  layer.split = h * qkv + proj * h + (m.qkv_bias() ? qkv : 0);
  layer.replicated =
      (m.add_bias_linear ? h : 0) + 2 * norm_parameters(m, h) +
      (m.qk_layernorm && !m.qk_layernorm_across_heads ? 2 * norm_parameters(m, static_cast<double>(m.head_dim())) : 0);
  // Across heads (OLMoE) the q/k norms span all heads and are split with them.
  if (m.qk_layernorm && m.qk_layernorm_across_heads) {
    layer.split += proj + static_cast<double>(m.query_groups() * m.head_dim());
  }
  if (!moe) {
    layer.split += mlp_weights(m, f, h) + (m.add_bias_linear ? fc1 : 0);
    layer.replicated += m.add_bias_linear ? h : 0;
    return layer;
  }
  const double experts = static_cast<double>(*m.num_moe_experts);
  layer.split += mlp_weights(m, static_cast<double>(m.moe_shared_expert_intermediate_size.value_or(0)), h);
  layer.replicated += h * experts + (m.moe_shared_expert_gate ? h : 0);
  layer.experts = experts * mlp_weights(m, static_cast<double>(m.moe_ffn_size()), h);
  return layer;
}

double position_parameters(const models::GPTConfig& m) {
  return m.position_embedding_type == models::PositionEmbeddingType::kLearnedAbsolute
             ? static_cast<double>(m.seq_length) * static_cast<double>(m.hidden_size)
             : 0;
}

// This rank's share of the sequence: the load-balanced split gives each context-parallel rank s / cp tokens of every
// sample (parallel/context_parallel/utils.h).
double local_sequence(const ConfigContainer& config) {
  return static_cast<double>(config.model.seq_length) / config.parallelism.context_parallel_size;
}

// The attention's part of one layer under context parallelism, one micro-batch, in bytes: what autograd keeps of
// context_parallel_attention (parallel/context_parallel/attention.cpp, ring_attention.cpp) and around it, for this
// rank's s / cp queries. Per token, with q = heads x head_dim and kv = groups x head_dim on this tensor-parallel rank,
// e the activations' bytes (2, 4 in fp32) and a the heads:
//   p2p         the local q, k and v (v a view of the QKV projection, which it keeps whole; q and k rotated by
//               RoPE are new tensors, and with grouped queries q is a copy), the ring's output (a copy apart from
//               the projection's input, which linear_proj keeps) and the fp32 log-sum-exp of every query row.
//   all_gather  the whole sequence's keys and values (2 kv x cp, in fp32: upcast for the softmax when e is 2), the
//               local queries in fp32 (in fp32 runs without RoPE or grouped queries the projection they view), the
//               fp32 probabilities of the local queries over the whole sequence (a x s x 4 bytes: an explicit softmax
//               through autograd), its [s / cp, s] boolean mask, and the projection's input.
//   a2a         the q, k and v of heads / cp heads over the whole sequence after the all-to-all, one tensor as large
//               as the local q, k and v (the key/value groups repeated up to a multiple of cp), the fused attention's
//               output over them and its fp32 log-sum-exp, and the projection's input.
double context_parallel_attention_bytes(const ConfigContainer& config) {
  const models::GPTConfig& m = config.model;
  const double tp = config.parallelism.tensor_model_parallel_size;
  const double cp = config.parallelism.context_parallel_size;
  const double s_local = local_sequence(config), s = static_cast<double>(m.seq_length);
  const double b = static_cast<double>(config.train.micro_batch_size);
  const double e = config.mixed_precision.enabled() ? 2 : 4;
  const double local_heads = static_cast<double>(m.num_attention_heads) / tp;
  const double local_groups = static_cast<double>(m.query_groups()) / tp;
  const double d = static_cast<double>(m.head_dim());
  const double q = local_heads * d, kv = local_groups * d;
  const double projection_input = q * e;
  // With grouped queries the model's q is a copy out of the projection (its heads are not adjacent there), not a view.
  const bool grouped = m.query_groups() != m.num_attention_heads;
  double per_token = 0;
  switch (m.cp_comm_type) {
    case parallel::context_parallel::CpCommType::kP2P:
      per_token = (q + 2 * kv) * e + (m.rotary() ? (q + kv) * e : (grouped ? q * e : 0)) + q * e + local_heads * 4 +
                  projection_input;
      break;
    case parallel::context_parallel::CpCommType::kAllGather: {
      const double queries = e == 4 && !m.rotary() && !grouped ? (q + 2 * kv) * 4 : q * 4;
      const double probabilities = local_heads * s * 4 + s;  // fp32 softmax and the boolean mask, [s / cp, s]
      per_token = queries + 2 * kv * cp * 4 + probabilities + projection_input;
      break;
    }
    case parallel::context_parallel::CpCommType::kA2A: {
      const auto groups = static_cast<int64_t>(local_groups);
      const auto ranks = static_cast<int64_t>(cp);
      const double repeats = groups % ranks == 0 ? 1 : static_cast<double>(std::lcm(groups, ranks) / groups);
      per_token = (q + 2 * kv * repeats) * e + q * e + local_heads * 4 + projection_input;
      break;
    }
  }
  return per_token * s_local * b;
}

// What one layer keeps for backward, one micro-batch: Korthikanti et al. 2022's count, s b h (10 + 24 / t) bytes at
// 16 bits for GPT's MLP, with s this rank's s / cp tokens. 10 are on every tensor-parallel rank: the two norms' inputs
// and outputs (QKV's and fc1's inputs), 2 bytes an element, and the two hidden-dropout masks, 1 byte (none without
// hidden dropout). 8 / t are attention's (q, k, v, the projection's input) and 16 / t the MLP's (fc1's output and the
// activation's; 32 / t gated: [gate; up], act(gate) and the product); the activations take twice that in fp32, the
// masks not. Sequence parallelism splits the 10 over the tensor-parallel ranks too (34 / t). The s x s probabilities
// (5 a s / h: softmax, dropout mask and dropped probabilities; 2 without dropout) are counted only where they are
// certainly kept: the unfused backend, or attention dropout on CPU (LibTorch's flash kernels take no dropout there).
// Selective recomputation takes out core_attn's probabilities and mlp's two outputs. Beyond Korthikanti, what bridge's
// layers certainly keep besides: RMSNorm (ATen's, composed) its normalised input, one more tensor a norm; RoPE the
// rotated q and k, new tensors beside the projection, which v views and attention keeps. Under context parallelism
// the attention part is context_parallel_attention_bytes' instead.
// The most the attention allocates at once beyond what it keeps, in the backward of one micro-batch (bytes). The
// context-parallel attentions that compute their scores with matmuls hold two fp32 score-sized tensors at once there:
// all_gather for the local queries over the whole sequence ([s / cp, s]: the gradients of the probabilities and of
// the scores), and p2p on LibTorch < 2.5 for the rank's own block, the largest of its ring ([s / cp, s / cp] for every
// local head: the recomputed probabilities and their gradient). The fused kernels (cp 1, a2a, and p2p's blocks on
// LibTorch >= 2.5, ring_attention.cpp) work in tiles: nothing counted.
// Full recomputation rebuilds the attention in backward too, so it changes nothing here.
double attention_workspace_bytes(const ConfigContainer& config) {
  const models::GPTConfig& m = config.model;
  if (config.parallelism.context_parallel_size == 1) return 0;
  const double s_local = local_sequence(config), s = static_cast<double>(m.seq_length);
  const double rows = static_cast<double>(config.train.micro_batch_size) * static_cast<double>(m.num_attention_heads) /
                      config.parallelism.tensor_model_parallel_size * s_local;
  switch (m.cp_comm_type) {
    case parallel::context_parallel::CpCommType::kP2P:
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
      return 0;
#else
      return 2 * rows * s_local * 4;
#endif
    case parallel::context_parallel::CpCommType::kAllGather:
      return 2 * rows * s * 4;
    case parallel::context_parallel::CpCommType::kA2A:
      return 0;
  }
  return 0;
}

// One layer's activations (bytes, one micro-batch), and the part of them its backward frees before it reaches the
// attention: the MLP's, the pre-MLP norm's and the second dropout mask's.
struct LayerActivations {
  double bytes = 0;
  double after_attention = 0;
};

LayerActivations layer_activation_bytes(const ConfigContainer& config) {
  const models::GPTConfig& m = config.model;
  const double tp = config.parallelism.tensor_model_parallel_size;
  const double s = local_sequence(config), h = static_cast<double>(m.hidden_size);
  const double b = static_cast<double>(config.train.micro_batch_size);
  const double a = static_cast<double>(m.num_attention_heads), f = static_cast<double>(m.ffn_size());
  const double mlp = m.recomputes("mlp") ? 0 : (m.gated_linear_unit ? 8 : 4) * f / h;
  const bool keeps_probabilities = m.attention_backend == models::AttnBackend::kUnfused ||
                                   (m.attention_dropout > 0 && config.parallelism.device == "cpu");
  const double probabilities =
      keeps_probabilities && !m.recomputes("core_attn") ? (m.attention_dropout > 0 ? 5 : 2) * a * s / h : 0;
  const double element_scale = config.mixed_precision.enabled() ? 1 : 2;  // 16-bit units to this run's bytes
  const double masks = m.hidden_dropout > 0 ? 2 : 0;
  const double rms_norm = m.normalization == models::Normalization::kRMSNorm ? 2 * 2 : 0;
  const double replicated = (8 + rms_norm) * element_scale + masks;
  const double sequence_share = models::uses_sequence_parallel(m, static_cast<int>(tp)) ? tp : 1;
  double attention = 0;  // bytes per token and hidden unit
  if (config.parallelism.context_parallel_size > 1 && !m.recomputes("core_attn")) {
    attention = context_parallel_attention_bytes(config) / (s * b * h);
  } else {
    const double rope =
        m.rotary() ? 2 * static_cast<double>(m.query_projection_size() + m.query_groups() * m.head_dim()) / h : 0;
    attention = (8 + rope + probabilities) / tp * element_scale;
  }
  LayerActivations layer;
  layer.bytes = s * b * h * (replicated / sequence_share + mlp / tp * element_scale + attention);
  layer.after_attention = s * b * h * (replicated / 2 / sequence_share + mlp / tp * element_scale);
  return layer;
}

}  // namespace

double num_parameters(const models::GPTConfig& m, int tensor_model_parallel_size) {
  const double vocab = static_cast<double>(parallel::tensor_parallel::vocab_size_with_padding(
      m.vocab_size, m.make_vocab_size_divisible_by, tensor_model_parallel_size));
  const double h = static_cast<double>(m.hidden_size);
  const double moe_layers = static_cast<double>(models::num_moe_layers(m));
  const LayerParameters dense = layer_parameters(m, false);
  const double layers = (static_cast<double>(m.num_layers) - moe_layers) * (dense.split + dense.replicated);
  double moe = 0;
  if (moe_layers > 0) {
    const LayerParameters layer = layer_parameters(m, true);
    moe = moe_layers * (layer.split + layer.replicated + layer.experts);
  }
  const double output = m.share_embeddings_and_output_weights ? 0 : vocab * h;
  return vocab * h + position_parameters(m) + layers + moe + norm_parameters(m, h) + output;
}

MemoryEstimate estimate_memory(const ConfigContainer& config, int world_size) {
  const models::GPTConfig& m = config.model;
  const double tp = config.parallelism.tensor_model_parallel_size;
  const int pp = config.parallelism.pipeline_model_parallel_size;
  const double h = static_cast<double>(m.hidden_size);
  const double s = local_sequence(config);  // this rank's tokens of each sample
  const double b = static_cast<double>(config.train.micro_batch_size);
  const double vocab = static_cast<double>(parallel::tensor_parallel::vocab_size_with_padding(
      m.vocab_size, m.make_vocab_size_divisible_by, config.parallelism.tensor_model_parallel_size));
  const double layers = static_cast<double>(m.num_layers) / pp;

  // An average layer of the stage: the MoE layers' share of the model's, their routed experts on this rank
  // (E / ep experts, each split over etp; Megatron's ÷ (etp · ep)) kept apart for the distributed optimizer.
  const double moe_share = static_cast<double>(models::num_moe_layers(m)) / static_cast<double>(m.num_layers);
  const LayerParameters dense_layer = layer_parameters(m, false);
  const LayerParameters moe_layer = moe_share > 0 ? layer_parameters(m, true) : LayerParameters{};
  const double ep = config.parallelism.expert_model_parallel_size;
  const double etp =
      config.parallelism.expert_tensor_parallel_size.value_or(config.parallelism.tensor_model_parallel_size);
  const double per_layer = (1 - moe_share) * (dense_layer.split / tp + dense_layer.replicated) +
                           moe_share * (moe_layer.split / tp + moe_layer.replicated);
  const double expert_per_layer = moe_share * moe_layer.experts / (etp * ep);
  const double stage_experts = layers * expert_per_layer;
  const double embedding = vocab * h / tp;
  const double positions = position_parameters(m);
  const double final_norm = norm_parameters(m, h);
  const double first = embedding + positions + layers * per_layer + (pp == 1 ? final_norm : 0);
  // The last stage holds the output layer, or a copy of the tied embedding when it is not also the first stage.
  const bool own_output = !m.share_embeddings_and_output_weights || pp > 1;
  const double last =
      layers * per_layer + final_norm + (own_output ? embedding : 0) + (pp == 1 ? embedding + positions : 0);

  const MixedPrecisionConfig& mp = config.mixed_precision;
  const double param_bytes = mp.enabled() ? 2 : 4;
  const double grad_bytes = !mp.enabled() || mp.grad_reduce_in_fp32 ? 4 : 2;
  double optimizer_bytes = config.optimizer.optimizer == "adam" ? 8 : (config.optimizer.sgd_momentum > 0 ? 4 : 0);
  if (mp.enabled()) optimizer_bytes += 4;  // fp32 master weights
  double expert_optimizer_bytes = optimizer_bytes;
  // The distributed optimizer keeps both for this rank's 1/(dp x cp) of the parameters (Megatron's 6 + 12 / dp with
  // bf16; it shards over the data- and context-parallel ranks, which hold the same replica: world / (tp x pp)), and
  // for 1/edp of its experts (edp = world / (etp · ep · pp)).
  const int64_t model_parallel = static_cast<int64_t>(config.parallelism.tensor_model_parallel_size) * pp;
  const auto expert_parallel = static_cast<int64_t>(etp * ep) * pp;
  if (config.optimizer.use_distributed_optimizer && world_size >= model_parallel) {
    optimizer_bytes /= static_cast<double>(world_size / model_parallel);
  }
  if (config.optimizer.use_distributed_optimizer && world_size >= expert_parallel) {
    expert_optimizer_bytes /= static_cast<double>(world_size / expert_parallel);
  }

  // 1F1B: the first stage keeps the activations of up to pp micro-batches (Megatron's report multiplies by pp).
  const int64_t microbatches = config.num_microbatches(world_size);
  const int64_t in_flight = std::max<int64_t>(1, std::min<int64_t>(pp, microbatches));
  const LayerActivations layer = layer_activation_bytes(config);
  const double layer_activations = layer.bytes;
  // Full recomputation keeps each checkpointed run's input, [s, b, h] per run ([s / tp, b, h] under sequence
  // parallelism; s / cp tokens under context parallelism), and rebuilds one run's activations at a time in backward.
  const double sequence_share = models::uses_sequence_parallel(m, static_cast<int>(tp)) ? tp : 1;
  const double run_input = s * b * h * (mp.enabled() ? 2 : 4) / sequence_share;
  const auto stage_activations = [&](double micro_batches) {
    if (m.recompute_granularity != models::RecomputeGranularity::kFull)
      return micro_batches * layers * layer_activations;
    const int vpp = config.parallelism.virtual_pipeline_model_parallel_size.value_or(1);
    const double chunk_layers = layers / vpp;
    const double n = std::min(static_cast<double>(m.recompute_num_layers.value_or(1)), chunk_layers);
    if (m.recompute_method == models::RecomputeMethod::kUniform) {
      return micro_batches * vpp * std::ceil(chunk_layers / n) * run_input + n * layer_activations;
    }
    // block: the first n layers of each chunk keep their inputs, the others everything.
    return micro_batches * vpp * (n * run_input + (chunk_layers - n) * layer_activations) +
           (n == chunk_layers ? layer_activations : 0);
  };
  // fp32 logits, which the loss turns into the softmax and then into their own gradient in place.
  const double logits = s * b * vocab / tp * 4;

  const auto stage = [&](double params, double activations) {
    MemoryEstimate estimate;
    estimate.parameters = params + stage_experts;
    estimate.weights = estimate.parameters * param_bytes;
    estimate.gradients = estimate.parameters * grad_bytes;
    estimate.optimizer = params * optimizer_bytes + stage_experts * expert_optimizer_bytes;
    estimate.activations = activations;
    estimate.microbatches_in_flight = in_flight;
    return estimate;
  };
  // The peak of a stage: what its forward keeps, or, when the attention's backward needs room of its own, what is
  // left of that when the backward reaches the last layer's attention (the logits and that layer's MLP half freed)
  // plus the attention's working set.
  const double workspace = attention_workspace_bytes(config);
  const auto peak = [&](double kept, double freed_first) {
    return std::max(kept, kept - freed_first - layer.after_attention + workspace);
  };
  const MemoryEstimate first_stage = stage(
      first, peak(stage_activations(static_cast<double>(in_flight)) + (pp == 1 ? logits : 0), pp == 1 ? logits : 0));
  const MemoryEstimate last_stage = stage(last, peak(stage_activations(1) + logits, logits));
  return first_stage.total() >= last_stage.total() ? first_stage : last_stage;
}

std::string format_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t unit = 0;
  while (bytes >= 1024 && unit + 1 < std::size(kUnits)) {
    bytes /= 1024;
    ++unit;
  }
  char text[48];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[unit]);
  return text;
}

std::string describe(const MemoryEstimate& estimate) {
  return format_bytes(estimate.total()) + " (weights " + format_bytes(estimate.weights) + ", gradients " +
         format_bytes(estimate.gradients) + ", optimizer " + format_bytes(estimate.optimizer) + ", activations " +
         format_bytes(estimate.activations) + " for " + std::to_string(estimate.microbatches_in_flight) +
         " micro-batch" + (estimate.microbatches_in_flight == 1 ? "" : "es") + " in flight)";
}

}  // namespace bridge::training::utils
