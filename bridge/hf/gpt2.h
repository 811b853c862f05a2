// The bridge to Hugging Face GPT-2 (transformers' GPT2LMHeadModel directories: config.json + model.safetensors),
// both ways, as Megatron-Bridge's GPT-2 bridge carries models between the two ecosystems. The weights are bridge's
// global tensors (the names of models::global_named_parameters, the same in every tp/pp/vpp layout), so an import
// loads into any layout and an export comes from any:
//   - HF's Conv1D weights are stored [in, out]: c_attn, c_proj, c_fc and mlp.c_proj are transposed;
//   - c_attn's columns are [Q | K | V], head-major; bridge's fused QKV is Megatron-Core's, grouped by head
//     ([q0 k0 v0 q1 k1 v1 ...]), so the rows are regrouped both ways (bridge/models/qkv_layout.h);
//   - the word embedding has HF's vocab_size rows (bridge pads it per layout; the padding is dropped on export),
//     the output layer is tied to it unless tie_word_embeddings is false;
//   - activation_function gelu_new (GPT-2's) is model.activation_func openai_gelu; gelu is gelu.
//
//   models::GPTConfig config = hf::gpt2_config("gpt2-dir");  // config.json's sizes as bridge's model fields
//   auto weights = hf::load_gpt2_weights("gpt2-dir", config);  // global tensors by bridge name
//   hf::save_gpt2("out-dir", weights, config);                 // loads with GPT2LMHeadModel.from_pretrained
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>

#include "bridge/hf/hf_artifacts.h"
#include "bridge/hf/shard_size.h"
#include "bridge/models/gpt_config.h"

namespace bridge::hf {

/// The model fields a GPT-2 directory's config.json sets (num_layers, hidden_size, num_attention_heads,
/// ffn_hidden_size, vocab_size, seq_length = n_positions, layernorm_epsilon, activation_func, tied embeddings,
/// init_method_std); the rest keep GPTConfig's defaults. Throws std::runtime_error naming the file for a config bridge
/// cannot reproduce (another model_type, scale_attn_by_inverse_layer_idx, an activation other than the GeLUs, ...).
models::GPTConfig gpt2_config(const std::filesystem::path& directory);

/// Checks that `config` (bridge's model) computes what the GPT-2 of `directory` computes, field by field; throws
/// std::invalid_argument naming the model.* field to set and the value the directory has.
void check_gpt2_config(const std::filesystem::path& directory, const models::GPTConfig& config);

/// The directory's weights as bridge's global tensors for `config`: fp32, the Conv1D weights transposed, the
/// position table cut to model.seq_length rows. Accepts the keys with or without the "transformer." prefix (old hub
/// files) and ignores attention-mask buffers. Throws std::runtime_error naming a missing or misshapen tensor.
std::map<std::string, torch::Tensor> load_gpt2_weights(const std::filesystem::path& directory,
                                                       const models::GPTConfig& config);

/// Writes `directory`/config.json and the weights (model.safetensors, or shards of at most `max_shard_bytes` with
/// their index) from bridge's global tensors (the embedding may be padded: its first config.vocab_size rows are
/// written), with `artifacts` beside them (hf_artifacts.h). Replaces an earlier export's files; creates the
/// directory.
void save_gpt2(const std::filesystem::path& directory, const std::map<std::string, torch::Tensor>& weights,
               const models::GPTConfig& config, int64_t max_shard_bytes = kMaxShardBytes,
               const HfArtifacts& artifacts = {});

}  // namespace bridge::hf
