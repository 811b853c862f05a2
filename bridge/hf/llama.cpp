// The Llama family both ways, dense and Mixture of Experts: config.json <-> GPTConfig through the family table, and
// one name/layout table between transformers' state dict and bridge's global tensors, with a row per expert tensor.
#include "bridge/hf/llama.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "bridge/hf/hf_files_internal.h"
#include "bridge/models/qkv_layout.h"
#include "bridge/models/rotary_pos_embedding.h"

namespace bridge::hf {
namespace {

namespace fs = std::filesystem;
using detail::value_or;
using nlohmann::json;

// Where a family's attention biases come from.
enum class AttentionBias {
  kConfigKey,  ///< config.json's attention_bias, on q, k, v and o (Llama, Qwen3, Qwen3-MoE, OLMoE)
  kQkvAlways,  ///< q, k and v always have one, o never (Qwen2)
  kQkvKey,     ///< q, k and v have one when config.json's qkv_bias says so (true unless set), o never (Qwen2-MoE)
  kNone,       ///< none (Mistral, Mixtral)
};

// The hub's names in an MoE layer: the block (mlp, or Mixtral's block_sparse_moe) and each expert's gate, up and down
// projections (gate_proj, up_proj, down_proj, or Mixtral's w1, w3, w2).
struct ExpertNames {
  const char* block;
  const char* gate_proj;
  const char* up_proj;
  const char* down_proj;
};

// transformers 5.x holds every family's experts in memory under Qwen2-MoE's names (mlp.gate, and the fused
// mlp.experts.gate_up_proj / down_proj), and save_pretrained writes them back under the family's own (its
// revert_weight_conversion); a file saved with save_original_format=False keeps these.
constexpr ExpertNames kInMemory = {"mlp", "gate_proj", "up_proj", "down_proj"};

// A family's Mixture of Experts: which config.json keys say what, and its hub names.
struct Moe {
  const char* experts_key;       ///< the expert count as the family writes it (num_experts or num_local_experts)
  const char* also_experts_key;  ///< the same count under the other name, written too (or null)
  const char* width_key;         ///< one expert's width: moe_intermediate_size, or intermediate_size (no dense MLPs)
  bool sparse_step;              ///< decoder_sparse_step and mlp_only_layers pick the MoE layers; else every layer
  bool norm_topk_key;            ///< norm_topk_prob says whether the k weights are renormalised; else always are
  bool shared_expert;            ///< a shared expert under a sigmoid gate (Qwen2-MoE)
  ExpertNames names;
};

// Qwen3-MoE: transformers 5.23 writes num_local_experts (its attribute_map), 4.x and the hub's checkpoints num_experts.
constexpr Moe kQwen3Moe = {"num_local_experts", "num_experts", "moe_intermediate_size", true, true, false, kInMemory};
constexpr Moe kQwen2Moe = {"num_experts", nullptr, "moe_intermediate_size", true, true, true, kInMemory};
constexpr Moe kMixtral = {
    "num_local_experts", nullptr, "intermediate_size", false, false, false, {"block_sparse_moe", "w1", "w3", "w2"}};
constexpr Moe kOlmoe = {"num_experts", nullptr, "intermediate_size", false, true, false, kInMemory};

// The family's q_norm and k_norm.
enum class QkNorm {
  kNone,
  kPerHead,      ///< an RMSNorm over each head's head_dim channels (Qwen3, Qwen3-MoE)
  kAcrossHeads,  ///< one RMSNorm over all heads' channels (OLMoE): model.qk_layernorm_across_heads
};

struct Family {
  std::string_view model_type;
  std::string_view architecture;
  AttentionBias bias;
  QkNorm qk_norm;
  const char* sliding_window;  ///< the key that switches a sliding window on, or null
  const Moe* moe;              ///< its experts, or null (dense)
  const char* refused;         ///< why bridge cannot compute this family's model, or null
};

constexpr Family kFamilies[] = {
    {"llama", "LlamaForCausalLM", AttentionBias::kConfigKey, QkNorm::kNone, nullptr, nullptr, nullptr},
    {"mistral", "MistralForCausalLM", AttentionBias::kNone, QkNorm::kNone, "sliding_window", nullptr, nullptr},
    {"qwen2", "Qwen2ForCausalLM", AttentionBias::kQkvAlways, QkNorm::kNone, "use_sliding_window", nullptr, nullptr},
    {"qwen3", "Qwen3ForCausalLM", AttentionBias::kConfigKey, QkNorm::kPerHead, "use_sliding_window", nullptr, nullptr},
    {"qwen2_moe", "Qwen2MoeForCausalLM", AttentionBias::kQkvKey, QkNorm::kNone, "use_sliding_window", &kQwen2Moe,
     nullptr},
    {"qwen3_moe", "Qwen3MoeForCausalLM", AttentionBias::kConfigKey, QkNorm::kPerHead, "use_sliding_window", &kQwen3Moe,
     nullptr},
    {"mixtral", "MixtralForCausalLM", AttentionBias::kNone, QkNorm::kNone, "sliding_window", &kMixtral, nullptr},
    {"olmoe", "OlmoeForCausalLM", AttentionBias::kConfigKey, QkNorm::kAcrossHeads, nullptr, &kOlmoe, nullptr},
};

const Family* find_family(std::string_view model_type) {
  for (const Family& family : kFamilies) {
    if (family.model_type == model_type) return &family;
  }
  return nullptr;
}

// When a layer tensor exists.
enum class When {
  kAlways,
  kQkvBias,
  kLinearBias,
  kQkNorm,
  kDenseMlp,          ///< a layer that moe_layer_freq leaves dense (every layer of a dense model)
  kDenseMlpBias,      ///< ... with add_bias_linear
  kMoe,               ///< an MoE layer
  kSharedExpert,      ///< an MoE layer with shared experts
  kSharedExpertGate,  ///< ... gated
};

bool present(When when, const models::GPTConfig& config, int64_t layer) {
  const bool moe = models::is_moe_layer(config, layer);
  switch (when) {
    case When::kQkvBias:
      return config.qkv_bias();
    case When::kLinearBias:
      return config.add_bias_linear;
    case When::kQkNorm:
      return config.qk_layernorm;
    case When::kDenseMlp:
      return !moe;
    case When::kDenseMlpBias:
      return !moe && config.add_bias_linear;
    case When::kMoe:
      return moe;
    case When::kSharedExpert:
      return moe && config.moe_shared_expert_intermediate_size.has_value();
    case When::kSharedExpertGate:
      return moe && config.moe_shared_expert_gate;
    case When::kAlways:
      break;
  }
  return true;
}

// How HF's tensors make bridge's: one as it is, q/k/v fused in Megatron-Core's layout, or [gate; up] stacked.
enum class Join { kOne, kQkv, kStack };

using Shape = std::vector<int64_t> (*)(const models::GPTConfig&);

// One tensor of a layer: bridge's name after "decoder.layers.<n>.", HF's parts after "model.layers.<n>.". In the
// names, {e} is the expert (global index: one row per expert), and {block}, {gate_proj}, {up_proj} and {down_proj} are
// the family's words (Moe).
struct LayerTensor {
  const char* bridge;
  std::vector<const char*> hf;
  Join join;
  When when;
  Shape shape;
  const char* fused = nullptr;  ///< transformers 5.x's [experts, ...] tensor holding this one of every expert
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
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{c.qk_layernorm_across_heads ? c.query_projection_size() : c.head_dim()};
       }},
      {"self_attention.k_layernorm.weight",
       {"self_attn.k_norm.weight"},
       Join::kOne,
       When::kQkNorm,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{c.qk_layernorm_across_heads ? c.query_groups() * c.head_dim() : c.head_dim()};
       }},
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
       When::kDenseMlp,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{2 * c.ffn_size(), c.hidden_size};
       }},
      {"mlp.linear_fc1.bias",
       {"mlp.gate_proj.bias", "mlp.up_proj.bias"},
       Join::kStack,
       When::kDenseMlpBias,
       [](const models::GPTConfig& c) { return std::vector<int64_t>{2 * c.ffn_size()}; }},
      {"mlp.linear_fc2.weight",
       {"mlp.down_proj.weight"},
       Join::kOne,
       When::kDenseMlp,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{c.hidden_size, c.ffn_size()};
       }},
      {"mlp.linear_fc2.bias", {"mlp.down_proj.bias"}, Join::kOne, When::kDenseMlpBias, hidden},
      {"mlp.router.weight",
       {"{block}.gate.weight"},
       Join::kOne,
       When::kMoe,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{*c.num_moe_experts, c.hidden_size};
       }},
      {"mlp.experts.local_experts.{e}.linear_fc1.weight",
       {"{block}.experts.{e}.{gate_proj}.weight", "{block}.experts.{e}.{up_proj}.weight"},
       Join::kStack,
       When::kMoe,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{2 * c.moe_ffn_size(), c.hidden_size};
       },
       "mlp.experts.gate_up_proj"},
      {"mlp.experts.local_experts.{e}.linear_fc2.weight",
       {"{block}.experts.{e}.{down_proj}.weight"},
       Join::kOne,
       When::kMoe,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{c.hidden_size, c.moe_ffn_size()};
       },
       "mlp.experts.down_proj"},
      {"mlp.shared_experts.linear_fc1.weight",
       {"{block}.shared_expert.gate_proj.weight", "{block}.shared_expert.up_proj.weight"},
       Join::kStack,
       When::kSharedExpert,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{2 * *c.moe_shared_expert_intermediate_size, c.hidden_size};
       }},
      {"mlp.shared_experts.linear_fc2.weight",
       {"{block}.shared_expert.down_proj.weight"},
       Join::kOne,
       When::kSharedExpert,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{c.hidden_size, *c.moe_shared_expert_intermediate_size};
       }},
      {"mlp.shared_experts.gate_weight",
       {"{block}.shared_expert_gate.weight"},
       Join::kOne,
       When::kSharedExpertGate,
       [](const models::GPTConfig& c) {
         return std::vector<int64_t>{1, c.hidden_size};
       }},
  };
  return table;
}

// A table name in a family's words: {block}, {gate_proj}, {up_proj}, {down_proj} from `names`, {e} the expert.
std::string expand(std::string_view pattern, const ExpertNames& names, int64_t expert) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size();) {
    if (pattern[i] != '{') {
      out += pattern[i++];
      continue;
    }
    const std::size_t end = pattern.find('}', i);
    const std::string_view word = pattern.substr(i + 1, end - i - 1);
    out += word == "e"           ? std::to_string(expert)
           : word == "block"     ? names.block
           : word == "gate_proj" ? names.gate_proj
           : word == "up_proj"   ? names.up_proj
                                 : names.down_proj;
    i = end + 1;
  }
  return out;
}

// One of bridge's global layer tensors and where a Hugging Face directory holds it.
struct Mapped {
  std::string bridge;
  std::vector<std::string> hub;        ///< the parts as save_pretrained writes them (joined by `join`)
  std::vector<std::string> in_memory;  ///< transformers 5.x's names for them where those differ (Mixtral's router)
  std::string fused;                   ///< or 5.x's [experts, ...] tensor, whose slice `expert` this is
  int64_t expert = -1;
  Join join = Join::kOne;
  std::vector<int64_t> shape;
};

// Every layer tensor of `config`'s model, the experts of an MoE layer one by one.
std::vector<Mapped> layer_mapping(const models::GPTConfig& config, const Family& family) {
  std::vector<Mapped> mapping;
  const ExpertNames& names = family.moe != nullptr ? family.moe->names : kInMemory;
  for (int64_t n = 0; n < config.num_layers; ++n) {
    const std::string ours = "decoder.layers." + std::to_string(n) + ".";
    const std::string theirs = "model.layers." + std::to_string(n) + ".";
    for (const LayerTensor& tensor : layer_tensors()) {
      if (!present(tensor.when, config, n)) continue;
      const bool per_expert = std::string_view(tensor.bridge).find("{e}") != std::string_view::npos;
      const int64_t experts = per_expert ? *config.num_moe_experts : 1;
      for (int64_t e = 0; e < experts; ++e) {
        Mapped mapped;
        mapped.bridge = ours + expand(tensor.bridge, names, e);
        for (const char* part : tensor.hf) {
          mapped.hub.push_back(theirs + expand(part, names, e));
          mapped.in_memory.push_back(theirs + expand(part, kInMemory, e));
        }
        if (mapped.in_memory == mapped.hub) mapped.in_memory.clear();
        if (tensor.fused != nullptr) {
          mapped.fused = theirs + tensor.fused;
          mapped.expert = e;
          mapped.in_memory.clear();  // 5.x holds experts fused only
        }
        mapped.join = tensor.join;
        mapped.shape = tensor.shape(config);
        mapping.push_back(std::move(mapped));
      }
    }
  }
  return mapping;
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

std::string text(const models::MoELayerFreq& freq) {
  if (freq.pattern.empty()) return std::to_string(freq.every);
  std::string out = "[";
  for (std::size_t i = 0; i < freq.pattern.size(); ++i) out += (i ? ", " : "") + std::to_string(freq.pattern[i]);
  return out + "]";
}

// rope_type yarn as bridge's yarn_* fields (Megatron-Core's), with transformers' defaults
// (_compute_yarn_parameters): original_max_position_embeddings the config's max_position_embeddings, a null factor
// their ratio, beta_fast 32 and beta_slow 1 (0 too: transformers reads them with `or`), truncate true. The attention
// factor: attention_factor when given; else transformers takes mscale / mscale_all_dim only when both are non-zero
// and otherwise 0.1 ln(factor) + 1, which is Megatron-Core's with mscale 1 and mscale_all_dim 0.
void read_yarn(const json& config, const json& rope, models::GPTConfig& gpt,
               const std::function<void(const std::string&)>& refuse) {
  const auto number = [&](const char* key, double fallback) {
    const auto it = rope.find(key);
    if (it == rope.end() || it->is_null()) return fallback;
    if (!it->is_number()) refuse(std::string("rope_parameters' ") + key + " is " + it->dump() + ", not a number");
    return it->get<double>();
  };
  const int64_t context = value_or<int64_t>(config, "max_position_embeddings", 4096);
  gpt.position_embedding_type = models::PositionEmbeddingType::kYarn;
  const double original = number("original_max_position_embeddings", static_cast<double>(context));
  if (original < 1 || original != std::floor(original)) {
    refuse("rope_parameters' original_max_position_embeddings is " + text(original) + "; it must be a whole >= 1");
  }
  gpt.yarn_original_max_position_embeddings = static_cast<int64_t>(original);
  gpt.yarn_rotary_scaling_factor = number("factor", static_cast<double>(context) / original);
  const double beta_fast = number("beta_fast", 0.0), beta_slow = number("beta_slow", 0.0);
  gpt.yarn_beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;
  gpt.yarn_beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
  gpt.yarn_correction_range_round_to_int = value_or<bool>(rope, "truncate", true);
  const double mscale = number("mscale", 0.0), mscale_all_dim = number("mscale_all_dim", 0.0);
  if (mscale != 0.0 && mscale_all_dim != 0.0) {
    gpt.yarn_mscale = mscale;
    gpt.yarn_mscale_all_dim = mscale_all_dim;
  } else {
    gpt.yarn_mscale = 1.0;
    gpt.yarn_mscale_all_dim = 0.0;
  }
  if (const auto it = rope.find("attention_factor"); it != rope.end() && !it->is_null()) {
    gpt.yarn_attention_factor = number("attention_factor", 1.0);
  }
}

// YaRN's rope_parameters: Megatron-Core's mscales where transformers reads them the same (both non-zero), else the
// attention factor itself unless it is transformers' default, 0.1 ln(factor) + 1.
void write_yarn(const models::GPTConfig& config, json& rope) {
  rope["factor"] = config.yarn_rotary_scaling_factor;
  rope["original_max_position_embeddings"] = config.yarn_original_max_position_embeddings;
  rope["beta_fast"] = config.yarn_beta_fast;
  rope["beta_slow"] = config.yarn_beta_slow;
  rope["truncate"] = config.yarn_correction_range_round_to_int;
  models::GPTConfig derived = config;
  derived.yarn_attention_factor.reset();
  if (!config.yarn_attention_factor && config.yarn_mscale != 0.0 && config.yarn_mscale_all_dim != 0.0) {
    rope["mscale"] = config.yarn_mscale;
    rope["mscale_all_dim"] = config.yarn_mscale_all_dim;
    return;
  }
  derived.yarn_mscale = 1.0;
  derived.yarn_mscale_all_dim = 0.0;
  const double factor = models::yarn_attention_factor(config);
  if (config.yarn_attention_factor || factor != models::yarn_attention_factor(derived)) {
    rope["attention_factor"] = factor;
  }
}

// The model types bridge reads, for messages: "llama, mistral, ..., mixtral".
std::string readable_types() {
  std::string out;
  for (const Family& family : kFamilies) {
    if (family.refused == nullptr) out += (out.empty() ? "" : ", ") + std::string(family.model_type);
  }
  return out;
}

// config.json's MoE keys as bridge's moe_* fields (`refuse` throws naming the file).
void read_moe(const json& config, const Moe& moe, models::GPTConfig& gpt,
              const std::function<void(const std::string&)>& refuse) {
  const auto required = [&](const char* key) {
    const auto it = config.find(key);
    if (it == config.end() || !it->is_number_integer()) refuse(std::string("has no integer ") + key);
    return it->get<int64_t>();
  };
  // Each family reads either name (transformers' attribute_map); they must agree when both are there.
  const int64_t experts = value_or<int64_t>(config, "num_experts", value_or<int64_t>(config, "num_local_experts", 0));
  if (value_or<int64_t>(config, "num_local_experts", experts) != experts) {
    refuse("num_experts (" + std::to_string(experts) + ") and num_local_experts (" +
           std::to_string(value_or<int64_t>(config, "num_local_experts", 0)) + ") disagree; keep one");
  }
  if (experts <= 0) return;  // Qwen-MoE with no experts: every layer dense
  gpt.num_moe_experts = experts;
  gpt.moe_router_topk = required("num_experts_per_tok");
  gpt.moe_ffn_hidden_size = required(moe.width_key);
  // transformers: softmax over all experts, the top k, renormalised over the k when norm_topk_prob (Mixtral: always).
  // Megatron-Core's pre_softmax is the softmax over all without renormalising; otherwise the softmax over the k.
  const bool renormalise = moe.norm_topk_key ? value_or<bool>(config, "norm_topk_prob", false) : true;
  if (gpt.moe_router_topk == 1 && renormalise) {
    refuse(std::string("num_experts_per_tok is 1 with the chosen expert's weight renormalised to 1") +
           (moe.norm_topk_key ? " (norm_topk_prob true)" : "") +
           "; bridge's router (Megatron-Core's) routes top-1 only with the softmax over all experts, which weighs the "
           "expert by its probability" +
           (moe.norm_topk_key ? ": set norm_topk_prob to false for that model" : ""));
  }
  gpt.moe_router_pre_softmax = !renormalise;
  gpt.moe_router_score_function = models::MoERouterScoreFunction::kSoftmax;
  gpt.moe_aux_loss_coeff = value_or<double>(config, "router_aux_loss_coef", 0.001);
  if (const double jitter = value_or<double>(config, "router_jitter_noise", 0.0); jitter > 0.0) {
    refuse("router_jitter_noise is " + text(jitter) +
           ": Mixtral multiplies its MoE input by uniform noise in training, which bridge's router does not; set "
           "router_jitter_noise to 0 in config.json to train without it");
  }
  if (moe.sparse_step) {
    // transformers: layer i is MoE unless i is in mlp_only_layers, and then iff (i + 1) % decoder_sparse_step == 0;
    // Megatron-Core's moe_layer_freq = N means i % N == 0, so anything but every layer becomes the explicit list.
    const int64_t step = value_or<int64_t>(config, "decoder_sparse_step", 1);
    if (step < 1) refuse("decoder_sparse_step is " + std::to_string(step) + "; it must be at least 1");
    std::set<int64_t> dense;
    for (const json& layer : value_or<json>(config, "mlp_only_layers", json::array())) {
      if (!layer.is_number_integer()) refuse("mlp_only_layers holds " + layer.dump() + ", not a layer index");
      dense.insert(layer.get<int64_t>());
    }
    std::vector<int64_t> pattern;
    for (int64_t i = 0; i < gpt.num_layers; ++i) pattern.push_back(dense.count(i) == 0 && (i + 1) % step == 0);
    gpt.moe_layer_freq = {};
    if (std::count(pattern.begin(), pattern.end(), 1) != gpt.num_layers) gpt.moe_layer_freq.pattern = pattern;
  }
  if (moe.shared_expert) {
    const int64_t shared = required("shared_expert_intermediate_size");
    if (shared < 1) refuse("shared_expert_intermediate_size is " + std::to_string(shared) + "; bridge needs >= 1");
    gpt.moe_shared_expert_intermediate_size = shared;
    gpt.moe_shared_expert_gate = true;
  }
}

}  // namespace

bool is_llama_family(std::string_view model_type) { return find_family(model_type) != nullptr; }

std::string llama_model_types() { return readable_types(); }

models::GPTConfig llama_config(const fs::path& directory) {
  const json config = detail::read_config(directory);
  const std::string where = (directory / "config.json").string();
  const std::string type = value_or<std::string>(config, "model_type", "");
  const Family* family = find_family(type);
  if (family == nullptr) {
    throw std::runtime_error(where + ": model_type is '" + type + "'; this bridge reads " + readable_types());
  }
  const auto refuse = [&](const std::string& why) { throw std::runtime_error(where + ": " + why); };
  if (family->refused != nullptr) refuse("model_type " + type + " is not supported: " + family->refused);
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
  } else if (rope_type == "yarn") {
    read_yarn(config, rope, gpt, refuse);
  } else if (rope_type != "default") {
    refuse("rope_type is '" + rope_type +
           "'; bridge's RoPE is the default one, Llama 3.1's scaling (llama3) or YaRN's (yarn)");
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
    case AttentionBias::kQkvKey:
      gpt.add_qkv_bias = value_or<bool>(config, "qkv_bias", true);
      break;
    case AttentionBias::kNone:
      break;
  }
  if (family->moe != nullptr) read_moe(config, *family->moe, gpt, refuse);
  if (gpt.num_moe_experts && attention_bias) {
    refuse(
        "attention_bias is true; bridge's Mixture-of-Experts models have no biases on their linear layers "
        "(model.add_bias_linear is false with experts), so q, k, v and o cannot have them");
  }
  if (attention_bias != mlp_bias) {
    refuse(std::string("attention_bias is ") + (attention_bias ? "true" : "false") + " but mlp_bias is " +
           (mlp_bias ? "true" : "false") + "; bridge's model.add_bias_linear puts biases on both or neither");
  }
  gpt.add_bias_linear = attention_bias;
  gpt.qk_layernorm = family->qk_norm != QkNorm::kNone;
  gpt.qk_layernorm_across_heads = family->qk_norm == QkNorm::kAcrossHeads;
  if (const auto clip = config.find("clip_qkv"); clip != config.end() && !clip->is_null()) {
    refuse("clip_qkv is " + clip->dump() +
           ": OLMoE clamps q, k and v to that bound, which bridge's attention does not; "
           "it must be null");
  }
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
  require(config.position_embedding_type == theirs.position_embedding_type, "position_embedding_type",
          std::string(models::to_string(theirs.position_embedding_type)));
  require(config.gated_linear_unit, "gated_linear_unit", "true");
  require(config.activation_func == theirs.activation_func, "activation_func",
          std::string(models::to_string(theirs.activation_func)));
  require(config.add_bias_linear == theirs.add_bias_linear, "add_bias_linear", flag(theirs.add_bias_linear));
  require(config.qkv_bias() == theirs.qkv_bias(), "add_qkv_bias", flag(theirs.qkv_bias()));
  require(config.qk_layernorm == theirs.qk_layernorm, "qk_layernorm", flag(theirs.qk_layernorm));
  require(config.qk_layernorm_across_heads == theirs.qk_layernorm_across_heads, "qk_layernorm_across_heads",
          flag(theirs.qk_layernorm_across_heads));
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
  if (theirs.position_embedding_type == models::PositionEmbeddingType::kYarn) {
    require(same(config.yarn_rotary_scaling_factor, theirs.yarn_rotary_scaling_factor), "yarn_rotary_scaling_factor",
            text(theirs.yarn_rotary_scaling_factor));
    require(config.yarn_original_max_position_embeddings == theirs.yarn_original_max_position_embeddings,
            "yarn_original_max_position_embeddings", std::to_string(theirs.yarn_original_max_position_embeddings));
    require(same(config.yarn_beta_fast, theirs.yarn_beta_fast), "yarn_beta_fast", text(theirs.yarn_beta_fast));
    require(same(config.yarn_beta_slow, theirs.yarn_beta_slow), "yarn_beta_slow", text(theirs.yarn_beta_slow));
    require(config.yarn_correction_range_round_to_int == theirs.yarn_correction_range_round_to_int,
            "yarn_correction_range_round_to_int", flag(theirs.yarn_correction_range_round_to_int));
    // The attention factor by its value: the mscales and an explicit yarn_attention_factor can spell the same one.
    require(same(models::yarn_attention_factor(config), models::yarn_attention_factor(theirs)), "yarn_attention_factor",
            text(models::yarn_attention_factor(theirs)));
  }
  require(config.share_embeddings_and_output_weights == theirs.share_embeddings_and_output_weights,
          "share_embeddings_and_output_weights", flag(theirs.share_embeddings_and_output_weights));
  // The experts: their number, the layers that have them (compared layer by layer: moe_layer_freq 1 and [1, 1, 1, 1]
  // are the same model), their width, the routing, the shared expert.
  require(config.num_moe_experts == theirs.num_moe_experts, "num_moe_experts",
          theirs.num_moe_experts ? std::to_string(*theirs.num_moe_experts) : "null (a dense model)");
  if (theirs.num_moe_experts) {
    for (int64_t layer = 0; layer < theirs.num_layers; ++layer) {
      require(models::is_moe_layer(config, layer) == models::is_moe_layer(theirs, layer), "moe_layer_freq",
              text(theirs.moe_layer_freq));
    }
    require(config.moe_ffn_size() == theirs.moe_ffn_size(), "moe_ffn_hidden_size",
            std::to_string(theirs.moe_ffn_size()));
    require(config.moe_router_topk == theirs.moe_router_topk, "moe_router_topk",
            std::to_string(theirs.moe_router_topk));
    require(config.moe_router_score_function == theirs.moe_router_score_function, "moe_router_score_function",
            "softmax");
    require(config.moe_router_pre_softmax == theirs.moe_router_pre_softmax, "moe_router_pre_softmax",
            flag(theirs.moe_router_pre_softmax));
    require(!config.moe_router_topk_scaling_factor, "moe_router_topk_scaling_factor", "null");
    require(!config.moe_router_num_groups, "moe_router_num_groups", "null (no group-limited routing)");
    require(!config.moe_router_enable_expert_bias, "moe_router_enable_expert_bias", "false");
    require(config.moe_shared_expert_intermediate_size == theirs.moe_shared_expert_intermediate_size,
            "moe_shared_expert_intermediate_size",
            theirs.moe_shared_expert_intermediate_size ? std::to_string(*theirs.moe_shared_expert_intermediate_size)
                                                       : "null");
    require(config.moe_shared_expert_gate == theirs.moe_shared_expert_gate, "moe_shared_expert_gate",
            flag(theirs.moe_shared_expert_gate));
  }
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

std::map<std::string, torch::Tensor> load_llama_weights(const fs::path& directory, const models::GPTConfig& config,
                                                        const std::function<bool(const std::string&)>& wanted) {
  check_llama_config(directory, config);
  const Family& family = *find_family(value_or<std::string>(detail::read_config(directory), "model_type", ""));
  const std::vector<Mapped> mapping = layer_mapping(config, family);
  const auto keep = [&](const std::string& name) { return !wanted || wanted(name); };
  // The directory's names for the wanted tensors: a sharded directory's other shards are not read.
  std::set<std::string> needed;
  if (keep("embedding.word_embeddings.weight")) needed.insert("model.embed_tokens.weight");
  if (keep("decoder.final_layernorm.weight")) needed.insert("model.norm.weight");
  if (keep("output_layer.weight")) needed.insert("lm_head.weight");
  for (const Mapped& mapped : mapping) {
    if (!keep(mapped.bridge)) continue;
    needed.insert(mapped.hub.begin(), mapped.hub.end());
    needed.insert(mapped.in_memory.begin(), mapped.in_memory.end());
    if (!mapped.fused.empty()) needed.insert(mapped.fused);
  }
  const std::map<std::string, torch::Tensor> file =
      detail::read_weights(directory, [&](const std::string& name) { return needed.count(name) > 0; });
  const std::string where = directory.string();
  const auto take = [&](const std::string& name) {
    const auto it = file.find(name);
    if (it == file.end()) throw std::runtime_error(where + " has no tensor " + name + ": not a model of this config");
    return it->second.to(torch::kFloat32);
  };
  const auto has_all = [&](const std::vector<std::string>& names) {
    if (names.empty()) return false;
    for (const std::string& name : names) {
      if (file.count(name) == 0) return false;
    }
    return true;
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
  if (keep("embedding.word_embeddings.weight")) {
    put("embedding.word_embeddings.weight", take("model.embed_tokens.weight"), {config.vocab_size, h});
  }
  for (const Mapped& mapped : mapping) {
    if (!keep(mapped.bridge)) continue;
    torch::Tensor value;
    if (!has_all(mapped.hub) && !mapped.fused.empty() && file.count(mapped.fused) > 0) {
      // transformers 5.x's fused experts, [experts, rows, columns]: this expert's slice.
      const torch::Tensor all = take(mapped.fused);
      if (all.dim() != 3 || all.size(0) != *config.num_moe_experts) {
        throw std::runtime_error(where + ": " + mapped.fused + " is " + detail::shape_of(all) + ", the model needs " +
                                 std::to_string(*config.num_moe_experts) + " experts of " +
                                 detail::shape_of(torch::empty(mapped.shape)));
      }
      value = all.select(0, mapped.expert);
    } else {
      const std::vector<std::string>& names =
          !has_all(mapped.hub) && has_all(mapped.in_memory) ? mapped.in_memory : mapped.hub;
      std::vector<torch::Tensor> parts;
      for (const std::string& part : names) parts.push_back(take(part));
      value = mapped.join == Join::kQkv     ? models::fuse_qkv(parts[0], parts[1], parts[2], config)
              : mapped.join == Join::kStack ? torch::cat(parts, 0)
                                            : parts[0];
    }
    put(mapped.bridge, value, mapped.shape);
  }
  if (keep("decoder.final_layernorm.weight")) put("decoder.final_layernorm.weight", take("model.norm.weight"), {h});
  if (!config.share_embeddings_and_output_weights && keep("output_layer.weight")) {
    put("output_layer.weight", take("lm_head.weight"), {config.vocab_size, h});
  }
  return weights;
}

void save_llama(const fs::path& directory, const std::map<std::string, torch::Tensor>& weights,
                const models::GPTConfig& config, std::string_view model_type, int64_t max_shard_bytes,
                const HfArtifacts& artifacts) {
  const Family* family = find_family(model_type);
  if (family == nullptr) {
    throw std::invalid_argument("save_llama: model_type '" + std::string(model_type) + "' is not one of " +
                                readable_types());
  }
  const auto need = [&](bool ok, const std::string& why) {
    if (!ok) throw std::invalid_argument("cannot write a " + std::string(model_type) + " model: " + why);
  };
  need(family->refused == nullptr, family->refused != nullptr ? family->refused : "");
  need(config.normalization == models::Normalization::kRMSNorm, "its norms are RMSNorm (model.normalization)");
  need(config.rotary(), "its positions are RoPE (model.position_embedding_type rope or yarn)");
  // transformers' Llama family has only the halves' rotation (rotate_half); an interleaved model's weights would load
  // there and compute something else.
  need(!config.rotary_interleaved,
       "its RoPE turns channel i with channel i + head_dim / 2 and transformers has no interleaved RoPE, but "
       "model.rotary_interleaved is true (this model turns adjacent channel pairs); train with "
       "model.rotary_interleaved=false to export to Hugging Face");
  need(config.gated_linear_unit, "its MLP is gated (model.gated_linear_unit)");
  need(config.qk_layernorm == (family->qk_norm != QkNorm::kNone), std::string("q/k norms are ") +
                                                                      (family->qk_norm != QkNorm::kNone ? "" : "not ") +
                                                                      "part of it (model.qk_layernorm)");
  need(config.qk_layernorm_across_heads == (family->qk_norm == QkNorm::kAcrossHeads),
       std::string("its q/k norms are ") + (family->qk_norm == QkNorm::kAcrossHeads ? "over all heads" : "per head") +
           " (model.qk_layernorm_across_heads)");
  const bool qkv_only_bias = config.add_qkv_bias && !config.add_bias_linear;
  if (family->bias != AttentionBias::kQkvKey) {
    need(qkv_only_bias == (family->bias == AttentionBias::kQkvAlways),
         "QKV biases without the other biases (model.add_qkv_bias) are Qwen2's and Qwen2-MoE's alone");
  }
  need(!config.add_bias_linear || family->bias == AttentionBias::kConfigKey,
       "it has no biases on its linear layers (model.add_bias_linear)");
  const Moe* moe = family->moe;
  need(config.num_moe_experts.has_value() == (moe != nullptr),
       moe != nullptr ? "it is a Mixture of Experts (model.num_moe_experts)"
                      : "it has no experts (model.num_moe_experts is set: export the model as qwen3_moe, qwen2_moe or "
                        "mixtral)");
  std::vector<int64_t> dense_layers;
  if (moe != nullptr) {
    need(config.moe_router_score_function == models::MoERouterScoreFunction::kSoftmax,
         "its router takes the softmax of its logits (model.moe_router_score_function)");
    need(!config.moe_router_topk_scaling_factor,
         "its routing weights are not scaled (model.moe_router_topk_scaling_factor)");
    need(!config.moe_router_num_groups, "its routing is not group-limited (model.moe_router_num_groups)");
    need(!config.moe_router_enable_expert_bias, "its router has no expert bias (model.moe_router_enable_expert_bias)");
    need(moe->norm_topk_key || !config.moe_router_pre_softmax,
         "it always renormalises the chosen experts' weights (model.moe_router_pre_softmax must be false)");
    need(config.moe_shared_expert_intermediate_size.has_value() == moe->shared_expert,
         moe->shared_expert
             ? "its MoE layers have a shared expert (model.moe_shared_expert_intermediate_size)"
             : "it has no shared experts (model.moe_shared_expert_intermediate_size; Qwen2-MoE has one)");
    need(config.moe_shared_expert_gate == moe->shared_expert,
         "its shared expert is scaled by a sigmoid gate (model.moe_shared_expert_gate)");
    for (int64_t n = 0; n < config.num_layers; ++n) {
      if (!models::is_moe_layer(config, n)) dense_layers.push_back(n);
    }
    need(moe->sparse_step || dense_layers.empty(), "every layer of it is MoE (model.moe_layer_freq)");
  }
  const auto get = [&](const std::string& name) {
    const auto it = weights.find(name);
    if (it == weights.end()) throw std::invalid_argument("save_llama: no weight " + name);
    return it->second.detach().to(torch::kCPU, torch::kFloat32);
  };
  std::map<std::string, torch::Tensor> tensors;
  tensors["model.embed_tokens.weight"] = get("embedding.word_embeddings.weight").narrow(0, 0, config.vocab_size);
  for (const Mapped& mapped : layer_mapping(config, *family)) {
    const torch::Tensor value = get(mapped.bridge);
    std::vector<torch::Tensor> parts;
    if (mapped.join == Join::kQkv) {
      const auto [q, k, v] = models::split_qkv(value, config);
      parts = {q, k, v};
    } else if (mapped.join == Join::kStack) {
      parts = value.chunk(2, 0);
    } else {
      parts = {value};
    }
    for (std::size_t i = 0; i < parts.size(); ++i) tensors[mapped.hub[i]] = parts[i].contiguous();
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
  if (config.position_embedding_type == models::PositionEmbeddingType::kYarn) {
    rope["rope_type"] = "yarn";
    write_yarn(config, rope);
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
  if (family->bias == AttentionBias::kQkvKey) hf["qkv_bias"] = config.add_qkv_bias;
  if (family->qk_norm == QkNorm::kAcrossHeads) hf["clip_qkv"] = nullptr;
  if (model_type == "llama") hf["mlp_bias"] = config.add_bias_linear;
  if (family->sliding_window != nullptr) {
    if (std::string_view(family->sliding_window) == "sliding_window") {
      hf["sliding_window"] = nullptr;
    } else {
      hf[family->sliding_window] = false;
    }
  }
  if (moe != nullptr) {
    hf[moe->experts_key] = *config.num_moe_experts;
    if (moe->also_experts_key != nullptr) hf[moe->also_experts_key] = *config.num_moe_experts;
    hf["num_experts_per_tok"] = config.moe_router_topk;
    hf[moe->width_key] = config.moe_ffn_size();  // Mixtral's intermediate_size: it has no dense MLPs
    if (moe->norm_topk_key) hf["norm_topk_prob"] = !config.moe_router_pre_softmax;
    hf["router_aux_loss_coef"] = config.moe_aux_loss_coeff;
    hf["output_router_logits"] = false;
    if (moe->sparse_step) {
      hf["decoder_sparse_step"] = 1;
      hf["mlp_only_layers"] = dense_layers;
    }
    if (moe->shared_expert) hf["shared_expert_intermediate_size"] = *config.moe_shared_expert_intermediate_size;
  }
  detail::write_directory(directory, tensors, hf, max_shard_bytes, artifacts);
}

}  // namespace bridge::hf
