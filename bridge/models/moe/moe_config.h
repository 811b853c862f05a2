// The Mixture-of-Experts options' types (Megatron-Core's TransformerConfig moe_* fields, whose values live on
// GPTConfig as they do on TransformerConfig) and the rules Megatron-Core's __post_init__ applies to them.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace bridge::models {

struct GPTConfig;

/// Megatron-Core's moe_router_score_function.
enum class MoERouterScoreFunction {
  kSoftmax,  ///< softmax over the experts (before top-k with moe_router_pre_softmax, else over the k chosen)
  kSigmoid,  ///< sigmoid per expert, the k chosen renormalised (DeepSeek-V3)
};

/// Megatron-Core's moe_router_load_balancing_type.
enum class MoELoadBalancingType {
  kAuxLoss,        ///< Switch/GShard auxiliary loss per micro-batch over the tensor-parallel group's tokens
  kSeqAuxLoss,     ///< the same per sequence (DeepSeek-V2/V3)
  kGlobalAuxLoss,  ///< token counts accumulated over the global batch and the data-parallel ranks
  kNone,
};

/// Megatron-Core's moe_token_dispatcher_type.
enum class MoETokenDispatcherType {
  kAllgather,  ///< all-gather every token over the tensor x expert group, keep those of the local experts
  kAlltoall,   ///< send each token only to the expert-parallel ranks of its experts (uneven all-to-all)
};

/// Megatron-Core's moe_token_drop_policy (with moe_expert_capacity_factor).
enum class MoETokenDropPolicy {
  kProbs,     ///< an expert over capacity keeps its highest-probability tokens
  kPosition,  ///< an expert over capacity keeps its earliest tokens
};

/// Megatron-Core's moe_router_dtype: the dtype of the router's logits and probabilities (fp32 when unset: the router
/// always runs in fp32 in bridge).
enum class MoERouterDtype { kFp32, kFp64 };

inline constexpr std::pair<MoERouterScoreFunction, std::string_view> kMoERouterScoreFunctionNames[] = {
    {MoERouterScoreFunction::kSoftmax, "softmax"}, {MoERouterScoreFunction::kSigmoid, "sigmoid"}};
inline constexpr std::pair<MoELoadBalancingType, std::string_view> kMoELoadBalancingTypeNames[] = {
    {MoELoadBalancingType::kAuxLoss, "aux_loss"},
    {MoELoadBalancingType::kSeqAuxLoss, "seq_aux_loss"},
    {MoELoadBalancingType::kGlobalAuxLoss, "global_aux_loss"},
    {MoELoadBalancingType::kNone, "none"}};
inline constexpr std::pair<MoETokenDispatcherType, std::string_view> kMoETokenDispatcherTypeNames[] = {
    {MoETokenDispatcherType::kAllgather, "allgather"}, {MoETokenDispatcherType::kAlltoall, "alltoall"}};
inline constexpr std::pair<MoETokenDropPolicy, std::string_view> kMoETokenDropPolicyNames[] = {
    {MoETokenDropPolicy::kProbs, "probs"}, {MoETokenDropPolicy::kPosition, "position"}};
inline constexpr std::pair<MoERouterDtype, std::string_view> kMoERouterDtypeNames[] = {{MoERouterDtype::kFp32, "fp32"},
                                                                                       {MoERouterDtype::kFp64, "fp64"}};

/// Megatron-Core's moe_layer_freq: an int N (layer i is MoE when i % N == 0; 1 = every layer) or an explicit 0/1
/// pattern with one entry per layer (Hugging Face's mlp_only_layers and decoder_sparse_step become one).
struct MoELayerFreq {
  int64_t every = 1;             ///< used when pattern is empty
  std::vector<int64_t> pattern;  ///< 1 = MoE, 0 = dense, one per layer
  bool operator==(const MoELayerFreq& other) const { return every == other.every && pattern == other.pattern; }
};

/// Whether global layer `layer` (0-based) of `config` is an MoE layer: num_moe_experts set and moe_layer_freq says so.
bool is_moe_layer(const GPTConfig& config, int64_t layer);
/// The number of MoE layers of the model.
int64_t num_moe_layers(const GPTConfig& config);

/// Megatron-Core's MoE rules (TransformerConfig.__post_init__ and the MoE layer's checks), each naming the field and
/// the fix (std::invalid_argument). `expert_model_parallel_size` and `expert_tensor_parallel_size` (0 = the
/// tensor-parallel size, Megatron's default) are the expert layout's sizes.
void validate_moe(const GPTConfig& config, int tensor_model_parallel_size, int expert_model_parallel_size,
                  int expert_tensor_parallel_size);

}  // namespace bridge::models
