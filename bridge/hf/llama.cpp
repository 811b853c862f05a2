// The Llama family both ways: config.json <-> GPTConfig through the family table, and one name/layout table between
// transformers' state dict and bridge's global tensors.
#include "bridge/hf/llama.h"

#include <cmath>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "bridge/hf/hf_files_internal.h"
#include "bridge/models/qkv_layout.h"

namespace bridge::hf {
namespace {

namespace fs = std::filesystem;
using detail::value_or;
using nlohmann::json;

// Where a family's attention biases come from.
enum class AttentionBias {
  kConfigKey,  ///< config.json's attention_bias, on q, k, v and o (Llama, Qwen3)
  kQkvAlways,  ///< q, k and v always have one, o never (Qwen2)
  kNone,       ///< none (Mistral)
};

struct Family {
  std::string_view model_type;
  std::string_view architecture;
  AttentionBias bias;
  bool qk_norm;                ///< q_norm and k_norm per head (Qwen3)
  const char* sliding_window;  ///< the key that switches a sliding window on, or null
};

constexpr Family kFamilies[] = {
    {"llama", "LlamaForCausalLM", AttentionBias::kConfigKey, false, nullptr},
    {"mistral", "MistralForCausalLM", AttentionBias::kNone, false, "sliding_window"},
    {"qwen2", "Qwen2ForCausalLM", AttentionBias::kQkvAlways, false, "use_sliding_window"},
    {"qwen3", "Qwen3ForCausalLM", AttentionBias::kConfigKey, true, "use_sliding_window"},
};

const Family* find_family(std::string_view model_type) {
  for (const Family& family : kFamilies) {
    if (family.model_type == model_type) return &family;
  }
  return nullptr;
}

// When a layer tensor exists.
enum class When { kAlways, kQkvBias, kLinearBias, kQkNorm };

bool present(When when, const models::GPTConfig& config) {
  switch (when) {
    case When::kQkvBias:
      return config.qkv_bias();
    case When::kLinearBias:
      return config.add_bias_linear;
    case When::kQkNorm:
      return config.qk_layernorm;
    case When::kAlways:
      break;
  }
  return true;
}

// How HF's tensors make bridge's: one as it is, q/k/v fused in Megatron-Core's layout, or [gate; up] stacked.
enum class Join { kOne, kQkv, kStack };

using Shape = std::vector<int64_t> (*)(const models::GPTConfig&);

// One tensor of a layer: bridge's name after "decoder.layers.<n>.", HF's parts after "model.layers.<n>.".
struct LayerTensor {
  const char* bridge;
  std::vector<const char*> hf;
  Join join;
  When when;
  Shape shape;
};

std::vector<int64_t> hidden(const models::GPTConfig& c) { return {c.hidden_size}; }

const std::vector<LayerTensor>& layer_tensors() {
  static const std::vector<LayerTensor> table = {
      {"input_layernorm.weight", {"input_layernorm.weight"}, Join::kOne, When::kAlways, hidden},
      {"self_attention.linear_qkv.weight",
       {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
       Join::kQkv,
       When::kAlways,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{c.qkv_size(), c.hidden_size};
       }},
      {"self_attention.linear_qkv.bias",
       {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"},
       Join::kQkv,
       When::kQkvBias,
       [](const models::GPTConfig& c) { return std::vector<int64_t>{c.qkv_size()}; }},
      {"self_attention.q_layernorm.weight",
       {"self_attn.q_norm.weight"},
       Join::kOne,
       When::kQkNorm,
       [](const models::GPTConfig& c) { return std::vector<int64_t>{c.head_dim()}; }},
      {"self_attention.k_layernorm.weight",
       {"self_attn.k_norm.weight"},
       Join::kOne,
       When::kQkNorm,
       [](const models::GPTConfig& c) { return std::vector<int64_t>{c.head_dim()}; }},
      {"self_attention.linear_proj.weight",
       {"self_attn.o_proj.weight"},
       Join::kOne,
       When::kAlways,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{c.hidden_size, c.query_projection_size()};
       }},
      {"self_attention.linear_proj.bias", {"self_attn.o_proj.bias"}, Join::kOne, When::kLinearBias, hidden},
      {"pre_mlp_layernorm.weight", {"post_attention_layernorm.weight"}, Join::kOne, When::kAlways, hidden},
      {"mlp.linear_fc1.weight",
       {"mlp.gate_proj.weight", "mlp.up_proj.weight"},
       Join::kStack,
       When::kAlways,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{2 * c.ffn_size(), c.hidden_size};
       }},
      {"mlp.linear_fc1.bias",
       {"mlp.gate_proj.bias", "mlp.up_proj.bias"},
       Join::kStack,
       When::kLinearBias,
       [](const models::GPTConfig& c) { return std::vector<int64_t>{2 * c.ffn_size()}; }},
      {"mlp.linear_fc2.weight",
       {"mlp.down_proj.weight"},
       Join::kOne,
       When::kAlways,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{c.hidden_size, c.ffn_size()};
       }},
      {"mlp.linear_fc2.bias", {"mlp.down_proj.bias"}, Join::kOne, When::kLinearBias, hidden},
  };
  return table;
}

// RoPE's parameters: transformers 5.x's rope_parameters, or 4.x's rope_theta and rope_scaling (null: none).
json rope_parameters(const json& config) {
  if (const auto it = config.find("rope_parameters"); it != config.end() && it->is_object()) return *it;
  json rope = json::object();
  if (const auto it = config.find("rope_scaling"); it != config.end() && it->is_object()) rope = *it;
  if (const auto it = config.find("rope_theta"); it != config.end() && !it->is_null()) rope["rope_theta"] = *it;
  return rope;
}

std::string text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

bool is_llama_family(std::string_view model_type) { return find_family(model_type) != nullptr; }

models::GPTConfig llama_config(const fs::path& directory) {
  const json config = detail::read_config(directory);
  const std::string where = (directory / "config.json").string();
  const std::string type = value_or<std::string>(config, "model_type", "");
  const Family* family = find_family(type);
  if (family == nullptr) {
    throw std::runtime_error(where + ": model_type is '" + type + "'; this bridge reads llama, mistral, qwen2, qwen3");
  }
  const auto refuse = [&](const std::string& why) { throw std::runtime_error(where + ": " + why); };
  models::GPTConfig gpt;
  gpt.num_layers = value_or<int64_t>(config, "num_hidden_layers", 32);
  gpt.hidden_size = value_or<int64_t>(config, "hidden_size", 4096);
  gpt.num_attention_heads = value_or<int64_t>(config, "num_attention_heads", 32);
  gpt.num_query_groups = value_or<int64_t>(config, "num_key_value_heads", gpt.num_attention_heads);
  gpt.kv_channels = value_or<int64_t>(config, "head_dim", gpt.hidden_size / gpt.num_attention_heads);
  gpt.ffn_hidden_size = value_or<int64_t>(config, "intermediate_size", 11008);
  gpt.vocab_size = value_or<int64_t>(config, "vocab_size", 32000);
  gpt.normalization = models::Normalization::kRMSNorm;
  gpt.layernorm_epsilon = value_or<double>(config, "rms_norm_eps", 1e-6);
  gpt.gated_linear_unit = true;
  const std::string act = value_or<std::string>(config, "hidden_act", "silu");
  if (act == "silu" || act == "swish") {
    gpt.activation_func = models::ActivationFunc::kSilu;
  } else if (act == "gelu") {
    gpt.activation_func = models::ActivationFunc::kGelu;
  } else if (act == "gelu_pytorch_tanh" || act == "gelu_new") {
    gpt.activation_func = models::ActivationFunc::kOpenaiGelu;
  } else {
    refuse("hidden_act '" + act + "' is not one of bridge's (silu, gelu, gelu_pytorch_tanh)");
  }
  gpt.position_embedding_type = models::PositionEmbeddingType::kRope;
  const json rope = rope_parameters(config);
  gpt.rotary_base = value_or<double>(rope, "rope_theta", 10000.0);
  gpt.rotary_percent =
      value_or<double>(rope, "partial_rotary_factor", value_or<double>(config, "partial_rotary_factor", 1.0));
  const std::string rope_type =
      value_or<std::string>(rope, "rope_type", value_or<std::string>(rope, "type", "default"));
  if (rope_type == "llama3") {
    gpt.rope_scaling = true;
    gpt.rope_scaling_factor = value_or<double>(rope, "factor", 8.0);
    gpt.rope_scaling_low_freq_factor = value_or<double>(rope, "low_freq_factor", 1.0);
    gpt.rope_scaling_high_freq_factor = value_or<double>(rope, "high_freq_factor", 4.0);
    gpt.rope_scaling_original_max_position_embeddings =
        value_or<int64_t>(rope, "original_max_position_embeddings", 8192);
  } else if (rope_type != "default") {
    refuse("rope_type is '" + rope_type + "'; bridge's RoPE is the default one or Llama 3.1's scaling (llama3)");
  }
  bool attention_bias = false, mlp_bias = false;
  switch (family->bias) {
    case AttentionBias::kConfigKey:
      attention_bias = value_or<bool>(config, "attention_bias", false);
      mlp_bias = value_or<bool>(config, "mlp_bias", false);
      break;
    case AttentionBias::kQkvAlways:
      gpt.add_qkv_bias = true;
      break;
    case AttentionBias::kNone:
      break;
  }
  if (attention_bias != mlp_bias) {
    refuse(std::string("attention_bias is ") + (attention_bias ? "true" : "false") + " but mlp_bias is " +
           (mlp_bias ? "true" : "false") + "; bridge's model.add_bias_linear puts biases on both or neither");
  }
  gpt.add_bias_linear = attention_bias;
  gpt.qk_layernorm = family->qk_norm;
  gpt.share_embeddings_and_output_weights = value_or<bool>(config, "tie_word_embeddings", false);
  gpt.hidden_dropout = 0.0;  // the family has none
  gpt.attention_dropout = value_or<double>(config, "attention_dropout", 0.0);
  gpt.init_method_std = value_or<double>(config, "initializer_range", 0.02);
  return gpt;
}

void check_llama_config(const fs::path& directory, const models::GPTConfig& config) {
  const models::GPTConfig theirs = llama_config(directory);
  const std::string where = (directory / "config.json").string();
  const auto require = [&](bool same, const std::string& field, const std::string& value) {
    if (!same) {
      throw std::invalid_argument("model." + field + " must be " + value + " to load " + where +
                                  ", whose model has that; set it to match");
    }
  };
  const auto same = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::abs(b); };
  const auto flag = [](bool value) { return std::string(value ? "true" : "false"); };
  require(config.num_layers == theirs.num_layers, "num_layers", std::to_string(theirs.num_layers));
  require(config.hidden_size == theirs.hidden_size, "hidden_size", std::to_string(theirs.hidden_size));
  require(config.num_attention_heads == theirs.num_attention_heads, "num_attention_heads",
          std::to_string(theirs.num_attention_heads));
  require(config.query_groups() == theirs.query_groups(), "num_query_groups", std::to_string(theirs.query_groups()));
  require(config.head_dim() == theirs.head_dim(), "kv_channels", std::to_string(theirs.head_dim()));
  require(config.ffn_size() == theirs.ffn_size(), "ffn_hidden_size", std::to_string(theirs.ffn_size()));
  require(config.vocab_size == theirs.vocab_size, "vocab_size", std::to_string(theirs.vocab_size));
  require(config.normalization == theirs.normalization, "normalization", "RMSNorm");
  require(config.position_embedding_type == theirs.position_embedding_type, "position_embedding_type", "rope");
  require(config.gated_linear_unit, "gated_linear_unit", "true");
  require(config.activation_func == theirs.activation_func, "activation_func",
          std::string(models::to_string(theirs.activation_func)));
  require(config.add_bias_linear == theirs.add_bias_linear, "add_bias_linear", flag(theirs.add_bias_linear));
  require(config.qkv_bias() == theirs.qkv_bias(), "add_qkv_bias", flag(theirs.qkv_bias()));
  require(config.qk_layernorm == theirs.qk_layernorm, "qk_layernorm", flag(theirs.qk_layernorm));
  require(same(config.layernorm_epsilon, theirs.layernorm_epsilon), "layernorm_epsilon",
          text(theirs.layernorm_epsilon));
  require(same(config.rotary_base, theirs.rotary_base), "rotary_base", text(theirs.rotary_base));
  require(same(config.rotary_percent, theirs.rotary_percent), "rotary_percent", text(theirs.rotary_percent));
  require(config.rope_scaling == theirs.rope_scaling, "rope_scaling", flag(theirs.rope_scaling));
  if (theirs.rope_scaling) {
    require(same(config.rope_scaling_factor, theirs.rope_scaling_factor), "rope_scaling_factor",
            text(theirs.rope_scaling_factor));
    require(same(config.rope_scaling_low_freq_factor, theirs.rope_scaling_low_freq_factor),
            "rope_scaling_low_freq_factor", text(theirs.rope_scaling_low_freq_factor));
    require(same(config.rope_scaling_high_freq_factor, theirs.rope_scaling_high_freq_factor),
            "rope_scaling_high_freq_factor", text(theirs.rope_scaling_high_freq_factor));
    require(
        config.rope_scaling_original_max_position_embeddings == theirs.rope_scaling_original_max_position_embeddings,
        "rope_scaling_original_max_position_embeddings",
        std::to_string(theirs.rope_scaling_original_max_position_embeddings));
  }
  require(config.share_embeddings_and_output_weights == theirs.share_embeddings_and_output_weights,
          "share_embeddings_and_output_weights", flag(theirs.share_embeddings_and_output_weights));
  // A sliding window shorter than the sequence changes what attention sees; bridge's is full causal attention.
  const json hf = detail::read_config(directory);
  const Family& family = *find_family(value_or<std::string>(hf, "model_type", ""));
  if (family.sliding_window != nullptr) {
    const bool on = std::string_view(family.sliding_window) == "sliding_window"
                        ? !value_or<json>(hf, "sliding_window", nullptr).is_null()
                        : value_or<bool>(hf, family.sliding_window, false);
    const int64_t window = value_or<int64_t>(hf, "sliding_window", 0);
    if (on && window < config.seq_length) {
      throw std::invalid_argument(
          where + ": " + family.sliding_window + " sets a sliding window of " + std::to_string(window) +
          " tokens, shorter than model.seq_length (" + std::to_string(config.seq_length) +
          "); bridge's attention sees the whole sequence: train at model.seq_length <= " + std::to_string(window));
    }
  }
}

std::map<std::string, torch::Tensor> load_llama_weights(const fs::path& directory, const models::GPTConfig& config) {
  check_llama_config(directory, config);
  const std::map<std::string, torch::Tensor> file = detail::read_weights(directory);
  const std::string where = directory.string();
  const auto take = [&](const std::string& name) {
    const auto it = file.find(name);
    if (it == file.end()) throw std::runtime_error(where + " has no tensor " + name + ": not a model of this config");
    return it->second.to(torch::kFloat32);
  };
  std::map<std::string, torch::Tensor> weights;
  const auto put = [&](const std::string& name, const torch::Tensor& tensor, const std::vector<int64_t>& shape) {
    if (tensor.sizes().vec() != shape) {
      throw std::runtime_error(where + ": " + name + " is " + detail::shape_of(tensor) + ", the model needs " +
                               detail::shape_of(torch::empty(shape)));
    }
    weights[name] = tensor.contiguous();
  };
  const int64_t h = config.hidden_size;
  put("embedding.word_embeddings.weight", take("model.embed_tokens.weight"), {config.vocab_size, h});
  for (int64_t n = 0; n < config.num_layers; ++n) {
    const std::string ours = "decoder.layers." + std::to_string(n) + ".";
    const std::string theirs = "model.layers." + std::to_string(n) + ".";
    for (const LayerTensor& tensor : layer_tensors()) {
      if (!present(tensor.when, config)) continue;
      std::vector<torch::Tensor> parts;
      for (const char* part : tensor.hf) parts.push_back(take(theirs + part));
      torch::Tensor value = tensor.join == Join::kQkv     ? models::fuse_qkv(parts[0], parts[1], parts[2], config)
                            : tensor.join == Join::kStack ? torch::cat(parts, 0)
                                                          : parts[0];
      put(ours + tensor.bridge, value, tensor.shape(config));
    }
  }
  put("decoder.final_layernorm.weight", take("model.norm.weight"), {h});
  if (!config.share_embeddings_and_output_weights) {
    put("output_layer.weight", take("lm_head.weight"), {config.vocab_size, h});
  }
  return weights;
}

void save_llama(const fs::path& directory, const std::map<std::string, torch::Tensor>& weights,
                const models::GPTConfig& config, std::string_view model_type, int64_t max_shard_bytes,
                const HfArtifacts& artifacts) {
  const Family* family = find_family(model_type);
  if (family == nullptr) {
    throw std::invalid_argument("save_llama: model_type '" + std::string(model_type) +
                                "' is not one of llama, mistral, qwen2, qwen3");
  }
  const auto need = [&](bool ok, const std::string& why) {
    if (!ok) throw std::invalid_argument("cannot write a " + std::string(model_type) + " model: " + why);
  };
  need(config.normalization == models::Normalization::kRMSNorm, "its norms are RMSNorm (model.normalization)");
  need(config.position_embedding_type == models::PositionEmbeddingType::kRope,
       "its positions are RoPE (model.position_embedding_type)");
  need(config.gated_linear_unit, "its MLP is gated (model.gated_linear_unit)");
  need(config.qk_layernorm == family->qk_norm,
       std::string("q/k norms are ") + (family->qk_norm ? "" : "not ") + "part of it (model.qk_layernorm)");
  const bool qkv_only_bias = config.add_qkv_bias && !config.add_bias_linear;
  need(qkv_only_bias == (family->bias == AttentionBias::kQkvAlways),
       "QKV biases without the other biases (model.add_qkv_bias) are Qwen2's alone");
  need(!config.add_bias_linear || family->bias == AttentionBias::kConfigKey,
       "it has no biases on its linear layers (model.add_bias_linear)");
  const auto get = [&](const std::string& name) {
    const auto it = weights.find(name);
    if (it == weights.end()) throw std::invalid_argument("save_llama: no weight " + name);
    return it->second.detach().to(torch::kCPU, torch::kFloat32);
  };
  std::map<std::string, torch::Tensor> tensors;
  tensors["model.embed_tokens.weight"] = get("embedding.word_embeddings.weight").narrow(0, 0, config.vocab_size);
  for (int64_t n = 0; n < config.num_layers; ++n) {
    const std::string ours = "decoder.layers." + std::to_string(n) + ".";
    const std::string theirs = "model.layers." + std::to_string(n) + ".";
    for (const LayerTensor& tensor : layer_tensors()) {
      if (!present(tensor.when, config)) continue;
      const torch::Tensor value = get(ours + tensor.bridge);
      std::vector<torch::Tensor> parts;
      if (tensor.join == Join::kQkv) {
        const auto [q, k, v] = models::split_qkv(value, config);
        parts = {q, k, v};
      } else if (tensor.join == Join::kStack) {
        parts = value.chunk(2, 0);
      } else {
        parts = {value};
      }
      for (std::size_t i = 0; i < parts.size(); ++i) tensors[theirs + tensor.hf[i]] = parts[i].contiguous();
    }
  }
  tensors["model.norm.weight"] = get("decoder.final_layernorm.weight");
  if (!config.share_embeddings_and_output_weights) {
    tensors["lm_head.weight"] = get("output_layer.weight").narrow(0, 0, config.vocab_size);
  }
  json rope = {{"rope_type", config.rope_scaling ? "llama3" : "default"}, {"rope_theta", config.rotary_base}};
  if (config.rope_scaling) {
    rope["factor"] = config.rope_scaling_factor;
    rope["low_freq_factor"] = config.rope_scaling_low_freq_factor;
    rope["high_freq_factor"] = config.rope_scaling_high_freq_factor;
    rope["original_max_position_embeddings"] = config.rope_scaling_original_max_position_embeddings;
  }
  if (config.rotary_percent < 1.0) rope["partial_rotary_factor"] = config.rotary_percent;
  const char* act = config.activation_func == models::ActivationFunc::kSilu   ? "silu"
                    : config.activation_func == models::ActivationFunc::kGelu ? "gelu"
                                                                              : "gelu_pytorch_tanh";
  json hf = {
      {"architectures", json::array({std::string(family->architecture)})},
      {"model_type", std::string(model_type)},
      {"vocab_size", config.vocab_size},
      {"hidden_size", config.hidden_size},
      {"intermediate_size", config.ffn_size()},
      {"num_hidden_layers", config.num_layers},
      {"num_attention_heads", config.num_attention_heads},
      {"num_key_value_heads", config.query_groups()},
      {"head_dim", config.head_dim()},
      {"hidden_act", act},
      {"max_position_embeddings", config.seq_length},
      {"rms_norm_eps", config.layernorm_epsilon},
      {"rope_parameters", rope},
      {"tie_word_embeddings", config.share_embeddings_and_output_weights},
      {"attention_dropout", config.attention_dropout},
      {"initializer_range", config.init_method_std},
      {"dtype", "float32"},
  };
  if (family->bias == AttentionBias::kConfigKey) hf["attention_bias"] = config.add_bias_linear;
  if (model_type == "llama") hf["mlp_bias"] = config.add_bias_linear;
  if (family->sliding_window != nullptr) {
    if (std::string_view(family->sliding_window) == "sliding_window") {
      hf["sliding_window"] = nullptr;
    } else {
      hf[family->sliding_window] = false;
    }
  }
  detail::write_directory(directory, tensors, hf, max_shard_bytes, artifacts);
}

}  // namespace bridge::hf
