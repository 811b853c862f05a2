// AutoBridge: the Hugging Face bridge for whatever a directory holds (Megatron-Bridge's AutoBridge), by its
// config.json's model_type: gpt2 (bridge/hf/gpt2.h) or the Llama family, llama, mistral, qwen2 and qwen3, with its
// Mixture-of-Experts kin qwen2_moe, qwen3_moe and mixtral (bridge/hf/llama.h). Exports pick the family from the
// model's shape.
//
//   models::GPTConfig config = hf::hf_model_config("dir");     // the model fields config.json sets
//   config = hf::with_hf_architecture(recipe.model, config);    // a recipe's run with the directory's model
//   auto weights = hf::load_hf_weights("dir", config);         // global tensors by bridge name
//   hf::save_hf("out", weights, config);                       // gpt2, llama, qwen2, qwen3, ... as the shape says
//   hf::save_hf("out", weights, config, "", hf::kMaxShardBytes, artifacts);  // with the tokenizer (hf_artifacts.h)
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bridge/hf/hf_artifacts.h"
#include "bridge/hf/shard_size.h"
#include "bridge/models/gpt_config.h"

namespace bridge::hf {

/// The directory's config.json model_type; std::runtime_error naming the file when bridge reads no such model.
std::string hf_model_type(const std::filesystem::path& directory);

/// The model fields the directory's config.json sets.
models::GPTConfig hf_model_config(const std::filesystem::path& directory);

/// Checks that `config` computes what the directory's model computes (std::invalid_argument naming the field).
void check_hf_config(const std::filesystem::path& directory, const models::GPTConfig& config);

/// The directory's weights as bridge's global tensors (fp32), after check_hf_config; with `wanted`, only those whose
/// names it accepts (an expert-parallel rank's own experts: the Llama family then skips the shards holding none).
std::map<std::string, torch::Tensor> load_hf_weights(const std::filesystem::path& directory,
                                                     const models::GPTConfig& config,
                                                     const std::function<bool(const std::string&)>& wanted = {});

/// `config` with its architecture (every field a Hugging Face config.json determines: sizes, groups, head width,
/// norm and epsilon, positions and RoPE, MLP, biases, q/k norms, tied embeddings, and the experts: their number,
/// layers, width, routing and shared expert) replaced by `theirs`'; the rest (seq_length, dropout, vocabulary padding,
/// initialisation, attention backend, and the MoE training choices: the auxiliary losses, capacity, dispatcher) kept.
/// AutoBridge's to_megatron_provider: an hf:<dir> run needs no model.* sizes.
models::GPTConfig with_hf_architecture(const models::GPTConfig& config, const models::GPTConfig& theirs);

/// The architecture fields where `ours` and `theirs` differ, as "model.hidden_size (128, config.json: 64)".
std::vector<std::string> architecture_differences(const models::GPTConfig& ours, const models::GPTConfig& theirs);

/// The model_type an export of `config` writes: gpt2 for learned positions; with experts qwen3_moe with q/k norms,
/// qwen2_moe with shared experts or QKV biases, else mixtral; without, qwen3 with q/k norms, qwen2 with QKV biases
/// alone, else llama.
std::string hf_model_type_for(const models::GPTConfig& config);

/// Writes the directory that AutoModelForCausalLM.from_pretrained loads, as `model_type` (hf_model_type_for(config)
/// when empty), its weights in shards of at most `max_shard_bytes` when they need more than one, with
/// generation_config.json and `artifacts`' tokenizer files (AutoTokenizer.from_pretrained loads them).
void save_hf(const std::filesystem::path& directory, const std::map<std::string, torch::Tensor>& weights,
             const models::GPTConfig& config, const std::string& model_type = "",
             int64_t max_shard_bytes = kMaxShardBytes, const HfArtifacts& artifacts = {});

}  // namespace bridge::hf
