// The bridge to Hugging Face's Llama family (transformers' LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
// and Qwen3ForCausalLM directories: config.json + model.safetensors or sharded safetensors), both ways, as
// Megatron-Bridge's Llama/Qwen bridges. The four share one state dict layout; a table says what each adds (Qwen2's
// QKV biases, Qwen3's q/k norms). Their models are bridge's GPT with RMSNorm, RoPE (Llama 3.1's scaling included),
// a SwiGLU MLP, grouped-query attention and no biases:
//   - q_proj, k_proj and v_proj are fused into linear_qkv in Megatron-Core's layout (bridge/models/qkv_layout.h);
//   - gate_proj and up_proj are linear_fc1's [gate; up], down_proj linear_fc2, o_proj linear_proj;
//   - input_layernorm and post_attention_layernorm are the layer's two norms, model.norm the final one;
//   - lm_head is the output layer unless tie_word_embeddings (Llama 3.2 1B/3B).
//
//   models::GPTConfig config = hf::llama_config("llama-dir");        // config.json as bridge's model fields
//   auto weights = hf::load_llama_weights("llama-dir", config);      // global tensors by bridge name
//   hf::save_llama("out-dir", weights, config, "llama");             // loads with AutoModelForCausalLM
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "bridge/hf/hf_artifacts.h"
#include "bridge/hf/shard_size.h"
#include "bridge/models/gpt_config.h"

namespace bridge::hf {

/// Whether bridge reads this model_type through this file: llama, mistral, qwen2, qwen3.
bool is_llama_family(std::string_view model_type);

/// The model fields the directory's config.json sets (sizes, groups, head width, RoPE with its base and scaling,
/// norm epsilon, biases, q/k norms, tied embeddings, dropout); seq_length keeps GPTConfig's default (the training
/// length is the user's). transformers 4.x's rope_theta/rope_scaling and 5.x's rope_parameters are both read. Throws
/// std::runtime_error naming the file and the key for what bridge cannot reproduce (another rope_type, biases on
/// attention but not on the MLP, an activation other than silu/gelu).
models::GPTConfig llama_config(const std::filesystem::path& directory);

/// Checks that `config` computes what the directory's model computes, field by field, and that its seq_length does
/// not need a sliding window the model has; throws std::invalid_argument naming the model.* field and the value.
void check_llama_config(const std::filesystem::path& directory, const models::GPTConfig& config);

/// The directory's weights as bridge's global tensors for `config` (fp32). Throws std::runtime_error naming a
/// missing or misshapen tensor.
std::map<std::string, torch::Tensor> load_llama_weights(const std::filesystem::path& directory,
                                                        const models::GPTConfig& config);

/// Writes config.json and the weights (model.safetensors, or shards of at most `max_shard_bytes` with their index)
/// of a `model_type` model (llama, mistral, qwen2 or qwen3) from bridge's global tensors, with `artifacts` beside
/// them (hf_artifacts.h); the word embedding and output layer lose bridge's vocabulary padding.
void save_llama(const std::filesystem::path& directory, const std::map<std::string, torch::Tensor>& weights,
                const models::GPTConfig& config, std::string_view model_type, int64_t max_shard_bytes = kMaxShardBytes,
                const HfArtifacts& artifacts = {});

}  // namespace bridge::hf
