// GPT-2 both ways: config.json <-> GPTConfig, and the name/layout table between transformers' state dict and
// bridge's global tensors.
#include "bridge/hf/gpt2.h"

#include <array>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "bridge/hf/hf_files_internal.h"
#include "bridge/models/qkv_layout.h"

namespace bridge::hf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using detail::read_config;
using detail::shape_of;
using detail::value_or;

constexpr const char* kConfig = "config.json";

// One tensor of a layer: bridge's name after "decoder.layers.<n>.", HF's after "h.<n>.", whether HF stores it
// transposed (Conv1D), and bridge's shape as multiples of the hidden size h, with 0 standing for the MLP width f.
// c_attn's rows (transposed) are [Q; K; V]; bridge's linear_qkv is Megatron-Core's, grouped by head (qkv).
struct LayerTensor {
  const char* bridge;
  const char* hf;
  bool conv1d;
  std::array<int, 2> shape;  // {rows, columns}: {3, 1} is [3h, h]; a column of 0 is none (a vector)
  bool qkv = false;
};

constexpr int kF = -1;  // the MLP width, in LayerTensor::shape

constexpr LayerTensor kLayerTensors[] = {
    {"input_layernorm.weight", "ln_1.weight", false, {1, 0}},
    {"input_layernorm.bias", "ln_1.bias", false, {1, 0}},
    {"self_attention.linear_qkv.weight", "attn.c_attn.weight", true, {3, 1}, true},
    {"self_attention.linear_qkv.bias", "attn.c_attn.bias", false, {3, 0}, true},
    {"self_attention.linear_proj.weight", "attn.c_proj.weight", true, {1, 1}},
    {"self_attention.linear_proj.bias", "attn.c_proj.bias", false, {1, 0}},
    {"pre_mlp_layernorm.weight", "ln_2.weight", false, {1, 0}},
    {"pre_mlp_layernorm.bias", "ln_2.bias", false, {1, 0}},
    {"mlp.linear_fc1.weight", "mlp.c_fc.weight", true, {kF, 1}},
    {"mlp.linear_fc1.bias", "mlp.c_fc.bias", false, {kF, 0}},
    {"mlp.linear_fc2.weight", "mlp.c_proj.weight", true, {1, kF}},
    {"mlp.linear_fc2.bias", "mlp.c_proj.bias", false, {1, 0}},
};

// A LayerTensor's shape for hidden size h and MLP width f.
std::vector<int64_t> shape_for(const LayerTensor& tensor, int64_t h, int64_t f) {
  std::vector<int64_t> shape;
  for (const int dim : tensor.shape) {
    if (dim != 0) shape.push_back(dim == kF ? f : dim * h);
  }
  return shape;
}

models::ActivationFunc activation_of(const std::string& name, const fs::path& path) {
  // transformers' ACT2FN names of GeLU's tanh approximation, and of the exact one.
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast") {
    return models::ActivationFunc::kOpenaiGelu;
  }
  if (name == "gelu" || name == "gelu_python") return models::ActivationFunc::kGelu;
  throw std::runtime_error(path.string() + ": activation_function '" + name +
                           "' is not one of bridge's (gelu_new, gelu_pytorch_tanh, gelu_fast: model.activation_func "
                           "openai_gelu; gelu: gelu)");
}

}  // namespace

models::GPTConfig gpt2_config(const fs::path& directory) {
  const json config = read_config(directory);
  const fs::path path = directory / kConfig;
  const std::string type = value_or<std::string>(config, "model_type", "gpt2");
  if (type != "gpt2") {
    throw std::runtime_error(path.string() + ": model_type is '" + type + "'; bridge's Hugging Face bridge reads gpt2");
  }
  for (const char* refused : {"scale_attn_by_inverse_layer_idx", "add_cross_attention"}) {
    if (value_or<bool>(config, refused, false)) {
      throw std::runtime_error(path.string() + ": " + refused + " is true, which bridge's attention does not do");
    }
  }
  if (!value_or<bool>(config, "scale_attn_weights", true)) {
    throw std::runtime_error(path.string() + ": scale_attn_weights is false; bridge scales attention by 1/sqrt(d)");
  }
  models::GPTConfig gpt;
  gpt.num_layers = value_or<int64_t>(config, "n_layer", 12);
  gpt.hidden_size = value_or<int64_t>(config, "n_embd", 768);
  gpt.num_attention_heads = value_or<int64_t>(config, "n_head", 12);
  gpt.ffn_hidden_size = value_or<int64_t>(config, "n_inner", 0);  // null: 4 x n_embd, bridge's 0
  gpt.vocab_size = value_or<int64_t>(config, "vocab_size", 50257);
  gpt.seq_length = value_or<int64_t>(config, "n_positions", 1024);
  gpt.layernorm_epsilon = value_or<double>(config, "layer_norm_epsilon", 1e-5);
  gpt.init_method_std = value_or<double>(config, "initializer_range", 0.02);
  gpt.activation_func = activation_of(value_or<std::string>(config, "activation_function", "gelu_new"), path);
  gpt.share_embeddings_and_output_weights = value_or<bool>(config, "tie_word_embeddings", true);
  gpt.hidden_dropout = value_or<double>(config, "resid_pdrop", 0.1);
  gpt.attention_dropout = value_or<double>(config, "attn_pdrop", 0.1);
  return gpt;
}

void check_gpt2_config(const fs::path& directory, const models::GPTConfig& config) {
  const models::GPTConfig theirs = gpt2_config(directory);
  const std::string where = (directory / kConfig).string();
  const auto require = [&](bool same, const std::string& field, const std::string& value) {
    if (!same) {
      throw std::invalid_argument("model." + field + " must be " + value + " to load " + where +
                                  ", whose model has that; set it to match");
    }
  };
  require(config.num_layers == theirs.num_layers, "num_layers", std::to_string(theirs.num_layers));
  require(config.hidden_size == theirs.hidden_size, "hidden_size", std::to_string(theirs.hidden_size));
  require(config.num_attention_heads == theirs.num_attention_heads, "num_attention_heads",
          std::to_string(theirs.num_attention_heads));
  require(config.ffn_size() == theirs.ffn_size(), "ffn_hidden_size", std::to_string(theirs.ffn_size()));
  require(config.vocab_size == theirs.vocab_size, "vocab_size", std::to_string(theirs.vocab_size));
  require(config.seq_length <= theirs.seq_length, "seq_length",
          "at most " + std::to_string(theirs.seq_length) + " (n_positions)");
  require(config.activation_func == theirs.activation_func, "activation_func",
          theirs.activation_func == models::ActivationFunc::kOpenaiGelu ? "openai_gelu" : "gelu");
  require(std::abs(config.layernorm_epsilon - theirs.layernorm_epsilon) <= 1e-12 * theirs.layernorm_epsilon,
          "layernorm_epsilon", std::to_string(theirs.layernorm_epsilon));
  require(config.share_embeddings_and_output_weights == theirs.share_embeddings_and_output_weights,
          "share_embeddings_and_output_weights", theirs.share_embeddings_and_output_weights ? "true" : "false");
}

std::map<std::string, torch::Tensor> load_gpt2_weights(const fs::path& directory, const models::GPTConfig& config) {
  check_gpt2_config(directory, config);
  const fs::path path = directory;  // errors name the directory: its weights may be sharded
  const std::map<std::string, torch::Tensor> file = detail::read_weights(directory);
  const auto take = [&](const std::string& name) {
    for (const std::string& key : {"transformer." + name, name}) {
      if (auto it = file.find(key); it != file.end()) return it->second.to(torch::kFloat32);
    }
    throw std::runtime_error(path.string() + " has no tensor transformer." + name + ": not a GPT-2 of this config");
  };
  const int64_t h = config.hidden_size, f = config.ffn_size();
  std::map<std::string, torch::Tensor> weights;
  const auto put = [&](const std::string& name, torch::Tensor tensor, std::vector<int64_t> shape) {
    if (tensor.sizes().vec() != shape) {
      throw std::runtime_error(path.string() + ": " + name + " is " + shape_of(tensor) + ", the model needs " +
                               shape_of(torch::empty(shape)));
    }
    weights[name] = tensor.contiguous();
  };
  put("embedding.word_embeddings.weight", take("wte.weight"), {config.vocab_size, h});
  const torch::Tensor positions = take("wpe.weight");
  put("embedding.position_embeddings.weight", positions.narrow(0, 0, std::min(positions.size(0), config.seq_length)),
      {config.seq_length, h});
  for (int64_t n = 0; n < config.num_layers; ++n) {
    const std::string ours = "decoder.layers." + std::to_string(n) + ".";
    const std::string theirs = "h." + std::to_string(n) + ".";
    for (const LayerTensor& tensor : kLayerTensors) {
      torch::Tensor value = take(theirs + tensor.hf);
      if (tensor.conv1d) value = value.t();
      if (tensor.qkv && value.size(0) == 3 * h) {
        const std::vector<torch::Tensor> parts = value.chunk(3, 0);
        value = models::fuse_qkv(parts[0], parts[1], parts[2], config);
      }
      put(ours + tensor.bridge, value, shape_for(tensor, h, f));
    }
  }
  put("decoder.final_layernorm.weight", take("ln_f.weight"), {h});
  put("decoder.final_layernorm.bias", take("ln_f.bias"), {h});
  if (!config.share_embeddings_and_output_weights) {
    const auto head = file.find("lm_head.weight");
    if (head == file.end()) throw std::runtime_error(path.string() + " has no lm_head.weight (untied)");
    put("output_layer.weight", head->second.to(torch::kFloat32), {config.vocab_size, h});
  }
  return weights;
}

void save_gpt2(const fs::path& directory, const std::map<std::string, torch::Tensor>& weights,
               const models::GPTConfig& config, int64_t max_shard_bytes, const HfArtifacts& artifacts) {
  const auto get = [&](const std::string& name) {
    const auto it = weights.find(name);
    if (it == weights.end()) throw std::invalid_argument("save_gpt2: no weight " + name);
    return it->second.detach().to(torch::kCPU, torch::kFloat32);
  };
  std::map<std::string, torch::Tensor> tensors;
  tensors["transformer.wte.weight"] = get("embedding.word_embeddings.weight").narrow(0, 0, config.vocab_size);
  tensors["transformer.wpe.weight"] = get("embedding.position_embeddings.weight");
  for (int64_t n = 0; n < config.num_layers; ++n) {
    for (const LayerTensor& tensor : kLayerTensors) {
      torch::Tensor value = get("decoder.layers." + std::to_string(n) + "." + tensor.bridge);
      if (tensor.qkv) {
        const auto [q, k, v] = models::split_qkv(value, config);
        value = torch::cat({q, k, v}, 0);
      }
      tensors["transformer.h." + std::to_string(n) + "." + tensor.hf] = tensor.conv1d ? value.t().contiguous() : value;
    }
  }
  tensors["transformer.ln_f.weight"] = get("decoder.final_layernorm.weight");
  tensors["transformer.ln_f.bias"] = get("decoder.final_layernorm.bias");
  if (!config.share_embeddings_and_output_weights) {
    tensors["lm_head.weight"] = get("output_layer.weight").narrow(0, 0, config.vocab_size);
  }
  const json hf = {
      {"architectures", json::array({"GPT2LMHeadModel"})},
      {"model_type", "gpt2"},
      {"n_layer", config.num_layers},
      {"n_embd", config.hidden_size},
      {"n_head", config.num_attention_heads},
      {"n_inner", config.ffn_size()},
      {"n_positions", config.seq_length},
      {"vocab_size", config.vocab_size},
      {"activation_function", config.activation_func == models::ActivationFunc::kOpenaiGelu ? "gelu_new" : "gelu"},
      {"layer_norm_epsilon", config.layernorm_epsilon},
      {"initializer_range", config.init_method_std},
      {"resid_pdrop", config.hidden_dropout},
      {"embd_pdrop", config.hidden_dropout},
      {"attn_pdrop", config.attention_dropout},
      {"tie_word_embeddings", config.share_embeddings_and_output_weights},
      {"bos_token_id", config.vocab_size - 1},  // GPT-2's <|endoftext|> is its last id, as bridge's EOD default
      {"eos_token_id", config.vocab_size - 1},
      {"torch_dtype", "float32"},
  };
  detail::write_directory(directory, tensors, hf, max_shard_bytes, artifacts);
}

}  // namespace bridge::hf
