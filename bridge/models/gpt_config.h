// GPTConfig: the shape of a GPT model (Megatron-Core's TransformerConfig, reduced to what a GPT needs) and how it is
// laid out over tensor- and pipeline-parallel ranks. validate() names the field and the fix for every bad value.
// The defaults are GPT-2's block (LayerNorm, learned positions, GeLU MLP, biases, tied embeddings); the Llama family
// is the same GPT with other switches, as Megatron-Core builds both from one GPTModel:
//
//   GPTConfig config;
//   config.num_layers = 12; config.hidden_size = 768; config.num_attention_heads = 12;
//   config.vocab_size = 50257; config.seq_length = 1024;
//   config.validate(/*tp=*/2, /*pp=*/2, /*vpp=*/std::nullopt);
//
//   // Llama-3-style: RMSNorm, RoPE, SwiGLU, 4 key/value groups, no biases, untied output layer.
//   config.normalization = Normalization::kRMSNorm;
//   config.position_embedding_type = PositionEmbeddingType::kRope;
//   config.gated_linear_unit = true; config.activation_func = ActivationFunc::kSilu;
//   config.num_query_groups = 4; config.add_bias_linear = false;
//   config.share_embeddings_and_output_weights = false;
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bridge/models/moe/moe_config.h"
#include "parallel/context_parallel/utils.h"

namespace bridge::models {

/// How attention is computed (Megatron-Core's AttnBackend, reduced to what LibTorch offers).
enum class AttnBackend {
  /// scaled_dot_product_attention on LibTorch 2.x (flash/memory-efficient kernels where they apply), the explicit
  /// softmax on 1.x.
  kAuto,
  /// Always the explicit matmul-softmax-matmul: the reference kAuto is checked and timed against.
  kUnfused,
};

/// The MLP's activation (Megatron-Core's activation_func). With gated_linear_unit, the gate's: silu is SwiGLU, gelu
/// GeGLU.
enum class ActivationFunc {
  /// GeLU with the exact erf (torch.nn.functional.gelu; Megatron's default).
  kGelu,
  /// GeLU's tanh approximation: OpenAI's GPT-2 (Hugging Face's `gelu_new`), Megatron's --openai-gelu.
  kOpenaiGelu,
  /// SiLU (x * sigmoid(x)): Llama's, Qwen's and Mistral's gate.
  kSilu,
};

/// Megatron-Core's normalization: LayerNorm (weight and bias) or RMSNorm (weight only).
enum class Normalization { kLayerNorm, kRMSNorm };

/// Megatron-Core's position_embedding_type.
enum class PositionEmbeddingType {
  kLearnedAbsolute,  ///< a learned [seq_length, h] table added to the word embedding (GPT-2)
  kRope,             ///< rotary embeddings applied to queries and keys in every layer (Llama)
  kYarn,             ///< rotary embeddings with YaRN's frequencies and attention factor (the yarn_* fields; Qwen)
  kNone,             ///< no position information besides the causal mask
};

/// Megatron-Core's recompute_granularity: what backward computes again instead of keeping from forward.
enum class RecomputeGranularity {
  kFull,       ///< whole layers (recompute_method, recompute_num_layers): each checkpointed run keeps only its input
  kSelective,  ///< the recompute_modules of every layer (core attention, the MLP)
};

/// Megatron-Core's recompute_method, how full recomputation picks the layers of each model chunk.
enum class RecomputeMethod {
  kUniform,  ///< every recompute_num_layers consecutive layers form one checkpointed run
  kBlock,    ///< the first recompute_num_layers layers are checkpointed one by one, the rest keep everything
};

/// The options' names in recipes (Megatron-Core's spellings; the first of a value is the one written).
inline constexpr std::pair<AttnBackend, std::string_view> kAttnBackendNames[] = {{AttnBackend::kAuto, "auto"},
                                                                                 {AttnBackend::kUnfused, "unfused"}};
inline constexpr std::pair<ActivationFunc, std::string_view> kActivationFuncNames[] = {
    {ActivationFunc::kGelu, "gelu"},
    {ActivationFunc::kOpenaiGelu, "openai_gelu"},
    {ActivationFunc::kOpenaiGelu, "fast_gelu"},  // Megatron-Bridge's name of the tanh GeLU
    {ActivationFunc::kSilu, "silu"}};
inline constexpr std::pair<Normalization, std::string_view> kNormalizationNames[] = {
    {Normalization::kLayerNorm, "LayerNorm"}, {Normalization::kRMSNorm, "RMSNorm"}};
inline constexpr std::pair<PositionEmbeddingType, std::string_view> kPositionEmbeddingTypeNames[] = {
    {PositionEmbeddingType::kLearnedAbsolute, "learned_absolute"},
    {PositionEmbeddingType::kRope, "rope"},
    {PositionEmbeddingType::kYarn, "yarn"},
    {PositionEmbeddingType::kNone, "none"}};

inline constexpr std::pair<RecomputeGranularity, std::string_view> kRecomputeGranularityNames[] = {
    {RecomputeGranularity::kFull, "full"}, {RecomputeGranularity::kSelective, "selective"}};
inline constexpr std::pair<RecomputeMethod, std::string_view> kRecomputeMethodNames[] = {
    {RecomputeMethod::kUniform, "uniform"}, {RecomputeMethod::kBlock, "block"}};

/// An option's name: to_string(Normalization::kRMSNorm) is "RMSNorm".
template <class E, std::size_t N>
std::string_view enum_name(E value, const std::pair<E, std::string_view> (&names)[N]) {
  for (const auto& [candidate, name] : names) {
    if (candidate == value) return name;
  }
  return "?";
}
inline std::string_view to_string(AttnBackend value) { return enum_name(value, kAttnBackendNames); }
inline std::string_view to_string(ActivationFunc value) { return enum_name(value, kActivationFuncNames); }
inline std::string_view to_string(Normalization value) { return enum_name(value, kNormalizationNames); }
inline std::string_view to_string(PositionEmbeddingType value) { return enum_name(value, kPositionEmbeddingTypeNames); }
inline std::string_view to_string(RecomputeGranularity value) { return enum_name(value, kRecomputeGranularityNames); }
inline std::string_view to_string(RecomputeMethod value) { return enum_name(value, kRecomputeMethodNames); }
inline std::string_view to_string(MoERouterScoreFunction value) {
  return enum_name(value, kMoERouterScoreFunctionNames);
}
inline std::string_view to_string(MoELoadBalancingType value) { return enum_name(value, kMoELoadBalancingTypeNames); }
inline std::string_view to_string(MoETokenDispatcherType value) {
  return enum_name(value, kMoETokenDispatcherTypeNames);
}
inline std::string_view to_string(MoETokenDropPolicy value) { return enum_name(value, kMoETokenDropPolicyNames); }
inline std::string_view to_string(MoERouterDtype value) { return enum_name(value, kMoERouterDtypeNames); }

struct GPTConfig {
  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t num_attention_heads = 4;
  /// Key/value heads (grouped-query attention; 1 is multi-query); 0 means num_attention_heads (multi-head).
  int64_t num_query_groups = 0;
  /// Width of one attention head; 0 means hidden_size / num_attention_heads.
  int64_t kv_channels = 0;
  /// MLP width; 0 means 4 * hidden_size.
  int64_t ffn_hidden_size = 0;
  /// Tokenizer vocabulary; the embedding is padded to a multiple of make_vocab_size_divisible_by * tp.
  int64_t vocab_size = 256;
  int64_t make_vocab_size_divisible_by = 128;
  /// Tokens per sample; with learned positions also the rows of the position table.
  int64_t seq_length = 64;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  AttnBackend attention_backend = AttnBackend::kAuto;
  ActivationFunc activation_func = ActivationFunc::kGelu;
  /// The MLP's first projection is two, [gate; up], and its output act(gate) * up (SwiGLU with silu).
  bool gated_linear_unit = false;
  Normalization normalization = Normalization::kLayerNorm;
  /// Epsilon of every LayerNorm or RMSNorm.
  double layernorm_epsilon = 1e-5;
  PositionEmbeddingType position_embedding_type = PositionEmbeddingType::kLearnedAbsolute;
  /// RoPE's base (Llama 2: 10000, Llama 3: 500000) and the share of each head's channels it rotates.
  double rotary_base = 10000.0;
  double rotary_percent = 1.0;
  /// Megatron-Core's rotary_interleaved: RoPE rotates adjacent channel pairs (0, 1), (2, 3), ... of each head (the
  /// original RoFormer / GPT-J layout) instead of channel i with channel i + rotary_dim / 2 (GPT-NeoX's halves, which
  /// Hugging Face's Llama uses).
  bool rotary_interleaved = false;
  /// Llama 3.1's frequency scaling of RoPE (Megatron-Core's rope_scaling and rope_scaling_factor; the other three
  /// are fixed in Megatron-Core to Llama 3.1's values and are read from Hugging Face's rope_scaling here).
  bool rope_scaling = false;
  double rope_scaling_factor = 8.0;
  double rope_scaling_low_freq_factor = 1.0;
  double rope_scaling_high_freq_factor = 4.0;
  int64_t rope_scaling_original_max_position_embeddings = 8192;
  /// YaRN (position_embedding_type yarn; Megatron-Core's yarn_* fields and defaults, Hugging Face's rope_type yarn):
  /// frequencies whose wavelength is below original / yarn_beta_fast rotations keep their value, those above
  /// original / yarn_beta_slow are divided by the factor, a linear ramp between (its ends rounded outwards with
  /// yarn_correction_range_round_to_int: Hugging Face's truncate); cos and sin are multiplied by the attention factor
  /// get_mscale(factor, yarn_mscale) / get_mscale(factor, yarn_mscale_all_dim), get_mscale(s, m) = 0.1 m ln s + 1,
  /// or by yarn_attention_factor when set (Hugging Face's attention_factor; Megatron-Core has no such field).
  double yarn_rotary_scaling_factor = 1.0;
  int64_t yarn_original_max_position_embeddings = 4096;
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;
  double yarn_mscale = 1.0;
  double yarn_mscale_all_dim = 0.0;
  bool yarn_correction_range_round_to_int = true;
  std::optional<double> yarn_attention_factor;
  /// Biases on the linear layers (QKV, projection, both MLP layers); GPT-2 has them, Llama has none.
  bool add_bias_linear = true;
  /// A bias on QKV even without add_bias_linear (Qwen2).
  bool add_qkv_bias = false;
  /// Normalization of each query and key head before RoPE (Qwen3, OLMo-2).
  bool qk_layernorm = false;
  /// With qk_layernorm: one RMSNorm over all query heads together (weight [heads x head_dim]) and one over all key
  /// heads, as OLMoE normalises q_proj's and k_proj's whole outputs; across tensor-parallel ranks the sum of squares is
  /// all-reduced and each rank holds its heads' share of the weights.
  bool qk_layernorm_across_heads = false;
  /// Standard deviation of the normal initialisation; output projections use std / sqrt(2 * num_layers).
  double init_method_std = 0.02;
  /// Seed of the weight initialisation. Every weight is drawn from its own generator seeded from this and the
  /// weight's name, so any tp/pp/vpp layout starts from the same model.
  uint64_t init_seed = 1234;
  /// Tie the output layer to the word embedding (GPT-2). With pp > 1 the last stage holds a copy whose gradient is
  /// summed with the first stage's over the embedding group.
  bool share_embeddings_and_output_weights = true;
  /// Megatron's gradient_accumulation_fusion: each linear layer's weight-gradient GEMM, and the word embedding's
  /// backward, add straight into the weight's main_grad in the DistributedDataParallel grad buffer (no temporary
  /// gradient, no extra pass). Off for code that takes weight gradients with torch::autograd::grad().
  bool gradient_accumulation_fusion = true;
  /// Activation recomputation (Megatron-Core's names): null keeps every activation; full recomputes whole layers,
  /// picked by recompute_method over recompute_num_layers; selective recomputes recompute_modules in every layer
  /// ("core_attn": q, k, v to the attention's output, which keeps the s x s probabilities of the unfused path and of
  /// dropout; "mlp": fc1 and its activation). Training only; dropout replays the same masks.
  std::optional<RecomputeGranularity> recompute_granularity;
  std::optional<RecomputeMethod> recompute_method;
  /// full: layers per checkpointed run (uniform) or layers checkpointed per model chunk (block); 1 to the layers of a
  /// pipeline stage.
  std::optional<int64_t> recompute_num_layers;
  /// selective: the modules recomputed; null means ["core_attn"], as Megatron-Core.
  std::optional<std::vector<std::string>> recompute_modules;
  /// Megatron-Core's sequence_parallel: the norms, dropouts and residuals work on [seq_length / tp, b, h], each
  /// tensor-parallel rank on its part of the sequence; an all-gather before each column-parallel GEMM and a
  /// reduce-scatter after each row-parallel one replace the all-reduce. Needs seq_length divisible by tp; off (as
  /// Megatron turns it off) at tp 1. Activations per layer go from s b h (10 + 24 / tp) to s b h 34 / tp bytes.
  bool sequence_parallel = false;
  /// Megatron-Core's cp_comm_type: how attention reaches the keys and values held by the other context-parallel
  /// ranks (parallelism.context_parallel_size > 1; parallel/context_parallel/attention.h): p2p (a ring that passes
  /// key/value blocks on while attention runs), all_gather (the whole sequence's keys and values on every rank) or a2a
  /// (Ulysses: an all-to-all trades heads for sequence; needs the heads per tensor-parallel rank divisible by cp).
  /// Read only at cp > 1. Megatron-Core's hierarchical a2a+p2p is not supported.
  parallel::context_parallel::CpCommType cp_comm_type = parallel::context_parallel::CpCommType::kP2P;

  // Mixture of Experts (Megatron-Core's moe_* fields; bridge/models/moe/). Unset num_moe_experts: a dense model.
  /// Routed experts per MoE layer; set, the MLP of the layers moe_layer_freq picks becomes an MoELayer.
  std::optional<int64_t> num_moe_experts;
  /// Which layers are MoE: every N-th (i % N == 0) or a 0/1 list with one entry per layer.
  MoELayerFreq moe_layer_freq;
  /// Width of one routed expert's MLP; unset = ffn_hidden_size.
  std::optional<int64_t> moe_ffn_hidden_size;
  /// Experts each token is routed to (k).
  int64_t moe_router_topk = 2;
  MoERouterScoreFunction moe_router_score_function = MoERouterScoreFunction::kSoftmax;
  /// softmax: the probabilities are the softmax over all experts, taken before top-k (no renormalisation); else the
  /// softmax over the k chosen logits. Top-1 softmax routing needs it (a softmax over one logit is always 1).
  bool moe_router_pre_softmax = false;
  /// The routing probabilities are multiplied by this (DeepSeek's routed_scaling_factor).
  std::optional<double> moe_router_topk_scaling_factor;
  /// Group-limited routing: experts in num_groups groups, tokens routed within the group_topk best groups.
  std::optional<int64_t> moe_router_num_groups;
  std::optional<int64_t> moe_router_group_topk;
  /// Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias added to the scores to choose experts (not to
  /// weight them), moved by moe_router_bias_update_rate toward balance after each step's gradient sync. Sigmoid only.
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  MoELoadBalancingType moe_router_load_balancing_type = MoELoadBalancingType::kAuxLoss;
  /// Weight of the load-balancing loss; 0 (Megatron's default) leaves it out of the gradient (it is still logged).
  double moe_aux_loss_coeff = 0.0;
  /// Weight of the router z-loss (ST-MoE); unset = none.
  std::optional<double> moe_z_loss_coeff;
  /// Expert capacity = ceil(tokens x topk / experts x factor); tokens past it are dropped. Unset = dropless.
  std::optional<double> moe_expert_capacity_factor;
  MoETokenDropPolicy moe_token_drop_policy = MoETokenDropPolicy::kProbs;
  /// With the capacity factor: every expert gets exactly its capacity of tokens (padding with zero-weight tokens).
  bool moe_pad_expert_input_to_capacity = false;
  /// Total width of the shared experts every token also goes through (Qwen2-MoE, DeepSeek); unset = none.
  std::optional<int64_t> moe_shared_expert_intermediate_size;
  /// The shared experts' output is scaled by sigmoid(x . gate_weight) (Qwen2-MoE).
  bool moe_shared_expert_gate = false;
  /// The router's logits and probabilities in fp64 instead of fp32.
  std::optional<MoERouterDtype> moe_router_dtype;
  MoETokenDispatcherType moe_token_dispatcher_type = MoETokenDispatcherType::kAllgather;
  /// Each MoE layer's auxiliary losses to the writers as moe/<name>_layer_<i> besides their average.
  bool moe_per_layer_logging = false;

  int64_t ffn_size() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int64_t head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
  int64_t query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  /// Rows of the fused QKV weight: a query head's and two key/value heads' per group.
  int64_t qkv_size() const { return (num_attention_heads + 2 * query_groups()) * head_dim(); }
  /// Megatron-Core's query_projection_size: the attention's inner width, linear_proj's input.
  int64_t query_projection_size() const { return num_attention_heads * head_dim(); }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  /// One routed expert's MLP width (moe_ffn_hidden_size, else ffn_size()).
  int64_t moe_ffn_size() const { return moe_ffn_hidden_size.value_or(ffn_size()); }
  /// Whether selective recomputation covers `module` ("core_attn", "mlp").
  bool recomputes(std::string_view module) const;
  /// Channels of each head that RoPE rotates (head_dim x rotary_percent).
  int64_t rotary_dim() const;
  /// Whether queries and keys are rotated: position_embedding_type rope or yarn.
  bool rotary() const {
    return position_embedding_type == PositionEmbeddingType::kRope ||
           position_embedding_type == PositionEmbeddingType::kYarn;
  }
  /// Throws std::invalid_argument naming the field ("model.num_attention_heads") for sizes that do not fit the layout.
  /// `expert_model_parallel_size` and `expert_tensor_parallel_size` (0 = the tensor-parallel size) check the MoE
  /// fields against the expert layout; `context_parallel_size` the sequence and attention against its split.
  void validate(int tensor_model_parallel_size = 1, int pipeline_model_parallel_size = 1,
                std::optional<int> virtual_pipeline_model_parallel_size = std::nullopt,
                int expert_model_parallel_size = 1, int expert_tensor_parallel_size = 0,
                int context_parallel_size = 1) const;
};

/// Whether the model runs sequence-parallel at this tensor-parallel size: model.sequence_parallel and tp > 1.
inline bool uses_sequence_parallel(const GPTConfig& config, int tensor_model_parallel_size) {
  return config.sequence_parallel && tensor_model_parallel_size > 1;
}

}  // namespace bridge::models
