// The bridge to Hugging Face's Llama family (transformers' LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
// and Qwen3ForCausalLM directories: config.json + model.safetensors or sharded safetensors) and its Mixture-of-Experts
// kin (Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM), both ways, as Megatron-Bridge's Llama/Qwen
// bridges. They share one state dict layout; a table says what each adds (Qwen2's QKV biases, Qwen3's q/k norms, the
// MoE families' experts). Their models are bridge's GPT with RMSNorm, RoPE (Llama 3.1's scaling included), a SwiGLU
// MLP, grouped-query attention and no biases:
//   - q_proj, k_proj and v_proj are fused into linear_qkv in Megatron-Core's layout (bridge/models/qkv_layout.h);
//   - gate_proj and up_proj are linear_fc1's [gate; up], down_proj linear_fc2, o_proj linear_proj;
//   - input_layernorm and post_attention_layernorm are the layer's two norms, model.norm the final one;
//   - lm_head is the output layer unless tie_word_embeddings (Llama 3.2 1B/3B);
//   - an MoE layer's gate is mlp.router, expert e's gate_proj/up_proj (Mixtral's w1/w3) and down_proj (w2) are
//     mlp.experts.local_experts.e.linear_fc1 ([gate; up]) and linear_fc2, Qwen2-MoE's shared_expert and
//     shared_expert_gate are mlp.shared_experts (linear_fc1, linear_fc2, gate_weight). Experts are read under the
//     hub's per-expert names (what save_pretrained writes) or transformers 5.x's fused [experts, ...] tensors
//     (mlp.experts.gate_up_proj, down_proj), and written under the hub's names.
// OLMoE (olmoe) is known but refused: its q/k norms span all heads, which bridge's model cannot compute.
//
//   models::GPTConfig config = hf::llama_config("llama-dir");        // config.json as bridge's model fields
//   auto weights = hf::load_llama_weights("llama-dir", config);      // global tensors by bridge name
//   hf::save_llama("out-dir", weights, config, "llama");             // loads with AutoModelForCausalLM
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "bridge/hf/hf_artifacts.h"
#include "bridge/hf/shard_size.h"
#include "bridge/models/gpt_config.h"

namespace bridge::hf {

/// Whether this model_type is one of this file's: llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, mixtral (and
/// olmoe, which llama_config refuses saying why).
bool is_llama_family(std::string_view model_type);

/// The model types this file reads, for messages: "llama, mistral, qwen2, ...".
std::string llama_model_types();

/// The model fields the directory's config.json sets (sizes, groups, head width, RoPE with its base and scaling,
/// norm epsilon, biases, q/k norms, tied embeddings, dropout; the experts: num_experts or num_local_experts,
/// num_experts_per_tok, the expert width, norm_topk_prob as moe_router_pre_softmax = !norm_topk_prob (Mixtral always
/// renormalises), decoder_sparse_step and mlp_only_layers as an explicit moe_layer_freq list unless every layer is MoE,
/// the shared expert and its gate, router_aux_loss_coef as moe_aux_loss_coeff); seq_length keeps GPTConfig's default
/// (the training length is the user's). transformers 4.x's rope_theta/rope_scaling and 5.x's rope_parameters are both
/// read. Throws std::runtime_error naming the file and the key for what bridge cannot reproduce (another rope_type,
/// biases on attention but not on the MLP, an activation other than silu/gelu, biases in an MoE model, Mixtral's
/// router_jitter_noise, top-1 routing with a renormalised weight, OLMoE).
models::GPTConfig llama_config(const std::filesystem::path& directory);

/// Checks that `config` computes what the directory's model computes, field by field, and that its seq_length does
/// not need a sliding window the model has; throws std::invalid_argument naming the model.* field and the value.
void check_llama_config(const std::filesystem::path& directory, const models::GPTConfig& config);

/// The directory's weights as bridge's global tensors for `config` (fp32); with `wanted`, only the tensors whose
/// bridge names it accepts (a rank's own experts), and a sharded directory's shards holding none of them are not
/// read. Throws std::runtime_error naming a missing or misshapen tensor.
std::map<std::string, torch::Tensor> load_llama_weights(const std::filesystem::path& directory,
                                                        const models::GPTConfig& config,
                                                        const std::function<bool(const std::string&)>& wanted = {});

/// Writes config.json and the weights (model.safetensors, or shards of at most `max_shard_bytes` with their index)
/// of a `model_type` model (llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe or mixtral) from bridge's global
/// tensors, with `artifacts` beside them (hf_artifacts.h); the word embedding and output layer lose bridge's
/// vocabulary padding; experts go under the hub's per-expert names, and config.json has the family's keys (Qwen3-MoE's
/// expert count as both num_local_experts, which transformers 5.x writes, and num_experts, which 4.x reads). Throws
/// std::invalid_argument naming the model.* field when `config` is not a model of that family.
void save_llama(const std::filesystem::path& directory, const std::map<std::string, torch::Tensor>& weights,
                const models::GPTConfig& config, std::string_view model_type, int64_t max_shard_bytes = kMaxShardBytes,
                const HfArtifacts& artifacts = {});

}  // namespace bridge::hf
