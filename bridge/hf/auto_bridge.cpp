// The dispatch between the GPT-2 and the Llama-family bridges (dense and Mixture of Experts).
#include "bridge/hf/auto_bridge.h"

#include <functional>
#include <iomanip>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "bridge/hf/gpt2.h"
#include "bridge/hf/hf_files_internal.h"
#include "bridge/hf/llama.h"

namespace bridge::hf {

std::string hf_model_type(const std::filesystem::path& directory) {
  const std::string type = detail::value_or<std::string>(detail::read_config(directory), "model_type", "");
  if (type != "gpt2" && !is_llama_family(type)) {
    throw std::runtime_error((directory / "config.json").string() + ": model_type is '" + type +
                             "'; bridge reads gpt2, " + llama_model_types());
  }
  return type;
}

models::GPTConfig hf_model_config(const std::filesystem::path& directory) {
  return hf_model_type(directory) == "gpt2" ? gpt2_config(directory) : llama_config(directory);
}

void check_hf_config(const std::filesystem::path& directory, const models::GPTConfig& config) {
  if (hf_model_type(directory) == "gpt2") {
    check_gpt2_config(directory, config);
  } else {
    check_llama_config(directory, config);
  }
}

std::map<std::string, torch::Tensor> load_hf_weights(const std::filesystem::path& directory,
                                                     const models::GPTConfig& config,
                                                     const std::function<bool(const std::string&)>& wanted) {
  if (hf_model_type(directory) != "gpt2") return load_llama_weights(directory, config, wanted);
  std::map<std::string, torch::Tensor> weights = load_gpt2_weights(directory, config);
  for (auto it = weights.begin(); it != weights.end();) {
    it = wanted && !wanted(it->first) ? weights.erase(it) : std::next(it);
  }
  return weights;
}

namespace {

// The architecture fields: each a name and a copy from one config to another, with its value as text.
struct ArchitectureField {
  const char* name;
  void (*adopt)(models::GPTConfig& to, const models::GPTConfig& from);
  std::string (*text)(const models::GPTConfig& config);
};

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <class T>
std::string as_text(const T& value) {
  if constexpr (IsOptional<T>::value) {
    return value ? as_text(*value) : "null";
  } else if constexpr (std::is_same_v<T, models::MoELayerFreq>) {
    if (value.pattern.empty()) return as_text(value.every);
    std::string text = "[";
    for (std::size_t i = 0; i < value.pattern.size(); ++i) text += (i ? ", " : "") + as_text(value.pattern[i]);
    return text + "]";
  } else if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_enum_v<T>) {
    return std::string(models::to_string(value));
  } else {
    std::ostringstream out;
    out << std::setprecision(17) << value;
    return out.str();
  }
}

#define BRIDGE_ARCHITECTURE_FIELD(member)                                                                    \
  ArchitectureField {                                                                                        \
    "model." #member, [](models::GPTConfig& to, const models::GPTConfig& from) { to.member = from.member; }, \
        [](const models::GPTConfig& c) { return as_text(c.member); }                                         \
  }

const ArchitectureField kArchitecture[] = {
    BRIDGE_ARCHITECTURE_FIELD(num_layers),
    BRIDGE_ARCHITECTURE_FIELD(hidden_size),
    BRIDGE_ARCHITECTURE_FIELD(num_attention_heads),
    BRIDGE_ARCHITECTURE_FIELD(num_query_groups),
    BRIDGE_ARCHITECTURE_FIELD(kv_channels),
    BRIDGE_ARCHITECTURE_FIELD(ffn_hidden_size),
    BRIDGE_ARCHITECTURE_FIELD(vocab_size),
    BRIDGE_ARCHITECTURE_FIELD(activation_func),
    BRIDGE_ARCHITECTURE_FIELD(gated_linear_unit),
    BRIDGE_ARCHITECTURE_FIELD(normalization),
    BRIDGE_ARCHITECTURE_FIELD(layernorm_epsilon),
    BRIDGE_ARCHITECTURE_FIELD(position_embedding_type),
    BRIDGE_ARCHITECTURE_FIELD(rotary_base),
    BRIDGE_ARCHITECTURE_FIELD(rotary_percent),
    BRIDGE_ARCHITECTURE_FIELD(rotary_interleaved),  // never in config.json: an hf: start leaves it false
    BRIDGE_ARCHITECTURE_FIELD(rope_scaling),
    BRIDGE_ARCHITECTURE_FIELD(rope_scaling_factor),
    BRIDGE_ARCHITECTURE_FIELD(rope_scaling_low_freq_factor),
    BRIDGE_ARCHITECTURE_FIELD(rope_scaling_high_freq_factor),
    BRIDGE_ARCHITECTURE_FIELD(rope_scaling_original_max_position_embeddings),
    BRIDGE_ARCHITECTURE_FIELD(yarn_rotary_scaling_factor),
    BRIDGE_ARCHITECTURE_FIELD(yarn_original_max_position_embeddings),
    BRIDGE_ARCHITECTURE_FIELD(yarn_beta_fast),
    BRIDGE_ARCHITECTURE_FIELD(yarn_beta_slow),
    BRIDGE_ARCHITECTURE_FIELD(yarn_mscale),
    BRIDGE_ARCHITECTURE_FIELD(yarn_mscale_all_dim),
    BRIDGE_ARCHITECTURE_FIELD(yarn_correction_range_round_to_int),
    BRIDGE_ARCHITECTURE_FIELD(yarn_attention_factor),
    BRIDGE_ARCHITECTURE_FIELD(add_bias_linear),
    BRIDGE_ARCHITECTURE_FIELD(add_qkv_bias),
    BRIDGE_ARCHITECTURE_FIELD(qk_layernorm),
    BRIDGE_ARCHITECTURE_FIELD(qk_layernorm_across_heads),
    BRIDGE_ARCHITECTURE_FIELD(share_embeddings_and_output_weights),
    // What the experts compute; the auxiliary losses, capacity and dispatcher are the run's choices.
    BRIDGE_ARCHITECTURE_FIELD(num_moe_experts),
    BRIDGE_ARCHITECTURE_FIELD(moe_layer_freq),
    BRIDGE_ARCHITECTURE_FIELD(moe_ffn_hidden_size),
    BRIDGE_ARCHITECTURE_FIELD(moe_router_topk),
    BRIDGE_ARCHITECTURE_FIELD(moe_router_score_function),
    BRIDGE_ARCHITECTURE_FIELD(moe_router_pre_softmax),
    BRIDGE_ARCHITECTURE_FIELD(moe_router_topk_scaling_factor),
    BRIDGE_ARCHITECTURE_FIELD(moe_router_num_groups),
    BRIDGE_ARCHITECTURE_FIELD(moe_router_group_topk),
    BRIDGE_ARCHITECTURE_FIELD(moe_router_enable_expert_bias),
    BRIDGE_ARCHITECTURE_FIELD(moe_shared_expert_intermediate_size),
    BRIDGE_ARCHITECTURE_FIELD(moe_shared_expert_gate),
};

#undef BRIDGE_ARCHITECTURE_FIELD

}  // namespace

models::GPTConfig with_hf_architecture(const models::GPTConfig& config, const models::GPTConfig& theirs) {
  models::GPTConfig adopted = config;
  for (const ArchitectureField& field : kArchitecture) field.adopt(adopted, theirs);
  return adopted;
}

std::vector<std::string> architecture_differences(const models::GPTConfig& ours, const models::GPTConfig& theirs) {
  std::vector<std::string> differences;
  for (const ArchitectureField& field : kArchitecture) {
    if (field.text(ours) != field.text(theirs)) {
      differences.push_back(std::string(field.name) + " (" + field.text(ours) + ", config.json: " + field.text(theirs) +
                            ")");
    }
  }
  return differences;
}

std::string hf_model_type_for(const models::GPTConfig& config) {
  if (config.position_embedding_type == models::PositionEmbeddingType::kLearnedAbsolute) return "gpt2";
  if (config.num_moe_experts) {
    if (config.qk_layernorm_across_heads) return "olmoe";
    if (config.qk_layernorm) return "qwen3_moe";
    if (config.moe_shared_expert_intermediate_size || config.add_qkv_bias) return "qwen2_moe";
    return "mixtral";
  }
  if (config.qk_layernorm) return "qwen3";
  if (config.add_qkv_bias && !config.add_bias_linear) return "qwen2";
  return "llama";
}

void save_hf(const std::filesystem::path& directory, const std::map<std::string, torch::Tensor>& weights,
             const models::GPTConfig& config, const std::string& model_type, int64_t max_shard_bytes,
             const HfArtifacts& artifacts) {
  const std::string type = model_type.empty() ? hf_model_type_for(config) : model_type;
  if (type == "gpt2") {
    save_gpt2(directory, weights, config, max_shard_bytes, artifacts);
  } else {
    save_llama(directory, weights, config, type, max_shard_bytes, artifacts);
  }
}

}  // namespace bridge::hf
