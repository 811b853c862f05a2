// GPTConfig::validate: every check names the field and says how to fix it.
#include "bridge/models/gpt_config.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "utils/check.h"

namespace bridge::models {
namespace {

using utils::checked_product;
using utils::require;

std::string str(int64_t value) { return std::to_string(value); }

// YaRN's fields (position_embedding_type yarn). Written so that NaN fails too: each is a number that the frequencies or
// the attention factor divide by or take the logarithm of.
void validate_yarn(const GPTConfig& config) {
  const auto number = [](double value) { return std::to_string(value); };
  require(!config.rope_scaling,
          "model.rope_scaling (Llama 3.1's scaling) is on with model.position_embedding_type yarn; they are two "
          "scalings of the same frequencies: set model.rope_scaling to false, or position_embedding_type to rope");
  require(config.yarn_rotary_scaling_factor >= 1.0 && config.yarn_rotary_scaling_factor < 1e6,
          "model.yarn_rotary_scaling_factor must be >= 1 (the new context over the original; Qwen3: 4), got " +
              number(config.yarn_rotary_scaling_factor));
  require(config.yarn_original_max_position_embeddings >= 1,
          "model.yarn_original_max_position_embeddings must be >= 1 (the context the model was first trained at), "
          "got " +
              str(config.yarn_original_max_position_embeddings));
  require(config.yarn_beta_slow > 0.0 && config.yarn_beta_slow < 1e6,
          "model.yarn_beta_slow must be > 0 (rotations; the usual is 1), got " + number(config.yarn_beta_slow));
  require(config.yarn_beta_fast >= config.yarn_beta_slow && config.yarn_beta_fast < 1e6,
          "model.yarn_beta_fast (" + number(config.yarn_beta_fast) + ") must be >= model.yarn_beta_slow (" +
              number(config.yarn_beta_slow) + "); the usual are 32 and 1");
  require(config.yarn_mscale >= 0.0 && config.yarn_mscale < 1e6,
          "model.yarn_mscale must be >= 0 (the usual is 1), got " + number(config.yarn_mscale));
  require(config.yarn_mscale_all_dim >= 0.0 && config.yarn_mscale_all_dim < 1e6,
          "model.yarn_mscale_all_dim must be >= 0 (0: the attention factor is 0.1 ln(factor) + 1), got " +
              number(config.yarn_mscale_all_dim));
  if (config.yarn_attention_factor) {
    require(*config.yarn_attention_factor > 0.0 && *config.yarn_attention_factor < 1e6,
            "model.yarn_attention_factor must be > 0 (or null: derived from the factor and the mscales), got " +
                number(*config.yarn_attention_factor));
  }
}

// Megatron-Core's TransformerConfig rules for the recompute_* fields, and the modules bridge can recompute.
void validate_recompute(const GPTConfig& config, int pipeline_model_parallel_size) {
  if (!config.recompute_granularity) return;
  const int64_t per_stage = config.num_layers / std::max(1, pipeline_model_parallel_size);
  if (*config.recompute_granularity == RecomputeGranularity::kFull) {
    require(config.recompute_method.has_value(),
            "model.recompute_granularity is full, so model.recompute_method must be uniform or block");
    require(config.recompute_num_layers.has_value() && *config.recompute_num_layers >= 1 &&
                *config.recompute_num_layers <= per_stage,
            "model.recompute_granularity is full, so model.recompute_num_layers must be between 1 and the layers "
            "of a pipeline stage (" +
                str(per_stage) + ")" +
                (config.recompute_num_layers ? ", got " + str(*config.recompute_num_layers) : std::string()));
    return;
  }
  require(!config.recompute_num_layers.has_value(),
          "model.recompute_num_layers must be null with model.recompute_granularity selective (it counts the layers "
          "of full recomputation); remove it or use recompute_granularity: full");
  for (const std::string& module : config.recompute_modules.value_or(std::vector<std::string>{})) {
    if (module == "core_attn" || module == "mlp") continue;
    std::string why = "bridge recomputes core_attn, mlp, moe and shared_experts";
    if (module == "layernorm") why = "bridge does not recompute the norms (Megatron's CheckpointWithoutOutput)";
    if (module == "moe_act") why = "bridge's experts have no fused grouped activation to recompute alone";
    if (module == "moe" || module == "shared_experts") continue;
    if (module == "mla_up_proj") why = "bridge's GPT has no multi-latent attention";
    throw std::invalid_argument("model.recompute_modules: '" + module + "' is not supported (" + why +
                                "); use core_attn, mlp, moe or shared_experts");
  }
}

// Context parallelism (parallel/context_parallel/): what the load-balanced split and the context-parallel attention
// need of the model. Called at cp > 1 only.
void validate_context_parallel(const GPTConfig& config, int tensor_model_parallel_size, int context_parallel_size) {
  const int64_t cp = context_parallel_size;
  const int64_t tp = tensor_model_parallel_size;
  require(config.seq_length % (2 * cp) == 0,
          "model.seq_length (" + str(config.seq_length) +
              ") must be divisible by 2 x parallelism.context_parallel_size (" + str(2 * cp) +
              "): each context-parallel rank keeps two equal chunks of every sequence (Megatron-Core's load-balanced "
              "split); use a multiple of " +
              str(2 * cp) + " (dataset.seq_length in Megatron-Bridge's keys) or another context_parallel_size");
  require(!uses_sequence_parallel(config, tensor_model_parallel_size) || (config.seq_length / cp) % tp == 0,
          "model.sequence_parallel splits each context-parallel rank's part of the sequence (model.seq_length / "
          "parallelism.context_parallel_size = " +
              str(config.seq_length / cp) +
              ") over the tensor-parallel ranks, but it is not divisible by the "
              "tensor-parallel size (" +
              str(tp) + "); make model.seq_length a multiple of " + str(2 * cp * tp) +
              " or set model.sequence_parallel: false");
  require(config.attention_dropout == 0.0,
          "model.attention_dropout is " + std::to_string(config.attention_dropout) +
              ", but the context-parallel attention (parallelism.context_parallel_size " + str(cp) +
              ") has no dropout; set model.attention_dropout: 0 (model.hidden_dropout still applies)");
  if (config.cp_comm_type == parallel::context_parallel::CpCommType::kA2A) {
    const int64_t local_heads = config.num_attention_heads / std::max<int64_t>(1, tp);
    require(
        local_heads % cp == 0,
        "model.cp_comm_type a2a gives each context-parallel rank 1/cp of the heads of its tensor-parallel rank, but "
        "model.num_attention_heads / tensor-parallel size (" +
            str(local_heads) + ") is not divisible by parallelism.context_parallel_size (" + str(cp) +
            "); use model.cp_comm_type p2p or all_gather, or a context_parallel_size that divides " + str(local_heads));
  }
}

}  // namespace

bool GPTConfig::recomputes(std::string_view module) const {
  if (recompute_granularity != RecomputeGranularity::kSelective) return false;
  const std::vector<std::string> modules = recompute_modules.value_or(std::vector<std::string>{"core_attn"});
  return std::find(modules.begin(), modules.end(), module) != modules.end();
}

int64_t GPTConfig::rotary_dim() const {
  // Megatron-Core's RotaryEmbedding: int(kv_channels * rotary_percent).
  return rotary_percent < 1.0 ? static_cast<int64_t>(static_cast<double>(head_dim()) * rotary_percent) : head_dim();
}

void GPTConfig::validate(int tensor_model_parallel_size, int pipeline_model_parallel_size,
                         std::optional<int> virtual_pipeline_model_parallel_size, int expert_model_parallel_size,
                         int expert_tensor_parallel_size, int context_parallel_size) const {
  require(num_layers >= 1, "model.num_layers must be >= 1, got " + str(num_layers));
  require(hidden_size >= 1, "model.hidden_size must be >= 1, got " + str(hidden_size));
  require(num_attention_heads >= 1, "model.num_attention_heads must be >= 1, got " + str(num_attention_heads));
  require(kv_channels >= 0,
          "model.kv_channels must be >= 0 (0 means hidden_size / num_attention_heads), got " + str(kv_channels));
  require(kv_channels > 0 || hidden_size % num_attention_heads == 0,
          "model.hidden_size (" + str(hidden_size) + ") must be divisible by model.num_attention_heads (" +
              str(num_attention_heads) + "), or set model.kv_channels (the width of one head)");
  require(num_query_groups >= 0,
          "model.num_query_groups must be >= 0 (0 means one per attention head), got " + str(num_query_groups));
  require(num_attention_heads % query_groups() == 0,
          "model.num_attention_heads (" + str(num_attention_heads) + ") must be divisible by model.num_query_groups (" +
              str(query_groups()) + "): each key/value group serves the same number of query heads");
  require(ffn_hidden_size >= 0,
          "model.ffn_hidden_size must be >= 0 (0 means 4 * hidden_size), got " + str(ffn_hidden_size));
  require(vocab_size >= 2, "model.vocab_size must be >= 2, got " + str(vocab_size));
  require(make_vocab_size_divisible_by >= 1,
          "model.make_vocab_size_divisible_by must be >= 1, got " + str(make_vocab_size_divisible_by));
  require(seq_length >= 1, "model.seq_length must be >= 1, got " + str(seq_length));
  require(hidden_dropout >= 0.0 && hidden_dropout < 1.0, "model.hidden_dropout must be in [0, 1)");
  require(attention_dropout >= 0.0 && attention_dropout < 1.0, "model.attention_dropout must be in [0, 1)");
  // Written so that NaN fails too; an infinite epsilon or std trains to exit 0 without learning.
  require(
      layernorm_epsilon > 0.0 && layernorm_epsilon < 1.0,
      "model.layernorm_epsilon must be in (0, 1), got " + std::to_string(layernorm_epsilon) + "; the usual is 1e-5");
  if (rotary()) {
    require(
        rotary_base > 1.0 && rotary_base < 1e300,
        "model.rotary_base must be > 1, got " + std::to_string(rotary_base) + "; Llama 2 uses 10000, Llama 3 500000");
    require(rotary_percent > 0.0 && rotary_percent <= 1.0,
            "model.rotary_percent must be in (0, 1], got " + std::to_string(rotary_percent));
    require(rotary_dim() >= 2 && rotary_dim() % 2 == 0,
            "model.rotary_percent (" + std::to_string(rotary_percent) + ") x the head width (" + str(head_dim()) +
                ") gives " + str(rotary_dim()) + " rotated channels; RoPE needs an even number >= 2");
    if (rope_scaling) {
      require(rope_scaling_factor >= 1.0 && rope_scaling_factor < 1e6,
              "model.rope_scaling_factor must be >= 1, got " + std::to_string(rope_scaling_factor));
      require(rope_scaling_low_freq_factor > 0.0 && rope_scaling_high_freq_factor > rope_scaling_low_freq_factor,
              "model.rope_scaling_high_freq_factor (" + std::to_string(rope_scaling_high_freq_factor) +
                  ") must be above model.rope_scaling_low_freq_factor (" +
                  std::to_string(rope_scaling_low_freq_factor) + "), which must be > 0 (Llama 3.1: 4 and 1)");
      require(rope_scaling_original_max_position_embeddings >= 1,
              "model.rope_scaling_original_max_position_embeddings must be >= 1 (Llama 3.1: 8192)");
    }
    if (position_embedding_type == PositionEmbeddingType::kYarn) validate_yarn(*this);
  }
  require(init_method_std > 0.0 && init_method_std <= 1.0, "model.init_method_std must be in (0, 1], got " +
                                                               std::to_string(init_method_std) +
                                                               "; Megatron's default is 0.02");
  // Sizes that would overflow inside the model, named here rather than by the allocator.
  const int64_t ffn = checked_product({{"model.hidden_size", hidden_size}, {"4", 4}}, "the default ffn_hidden_size");
  checked_product({{"model.vocab_size", vocab_size}, {"model.hidden_size", hidden_size}}, "the embedding's size");
  checked_product({{"model.num_layers", num_layers},
                   {"model.hidden_size", hidden_size},
                   {"model.ffn_hidden_size", ffn_hidden_size > 0 ? ffn_hidden_size : ffn},
                   {"2 weight matrices", 2}},
                  "the MLP parameters of the model");
  checked_product({{"model.num_layers", num_layers},
                   {"model.hidden_size", hidden_size},
                   {"model.hidden_size", hidden_size},
                   {"4 weight matrices", 4}},
                  "the attention parameters of the model");
  checked_product({{"model.num_attention_heads", num_attention_heads},
                   {"model.kv_channels", head_dim()},
                   {"model.hidden_size", hidden_size},
                   {"3 weight matrices", 3}},
                  "one layer's attention weights");
  checked_product({{"model.seq_length", seq_length},
                   {"model.seq_length", seq_length},
                   {"model.num_attention_heads", num_attention_heads}},
                  "one sample's attention scores");
  checked_product({{"model.make_vocab_size_divisible_by", make_vocab_size_divisible_by},
                   {"the tensor-parallel size", tensor_model_parallel_size}},
                  "the vocabulary padding");

  const int64_t tp = tensor_model_parallel_size;
  require(num_attention_heads % tp == 0, "model.num_attention_heads (" + str(num_attention_heads) +
                                             ") must be divisible by the tensor-parallel size (" + str(tp) +
                                             "): each rank holds whole heads");
  require(query_groups() % tp == 0, "model.num_query_groups (" + str(query_groups()) +
                                        ") must be divisible by the tensor-parallel size (" + str(tp) +
                                        "): each rank holds whole key/value groups, as in Megatron-Core; use a "
                                        "tensor-parallel size that divides " +
                                        str(query_groups()));
  require(ffn_size() % tp == 0, "model.ffn_hidden_size (" + str(ffn_size()) +
                                    ") must be divisible by the tensor-parallel size (" + str(tp) + ")");
  require(!uses_sequence_parallel(*this, tensor_model_parallel_size) || seq_length % tp == 0,
          "model.sequence_parallel splits each sequence over the tensor-parallel ranks, but model.seq_length (" +
              str(seq_length) + ") is not divisible by the tensor-parallel size (" + str(tp) + "); use a multiple of " +
              str(tp) + " or set model.sequence_parallel: false");
  require(!qk_layernorm_across_heads || (qk_layernorm && normalization == Normalization::kRMSNorm),
          "model.qk_layernorm_across_heads needs model.qk_layernorm: true and model.normalization: RMSNorm (OLMoE's "
          "q/k RMSNorm over all heads)");
  if (context_parallel_size > 1) validate_context_parallel(*this, tensor_model_parallel_size, context_parallel_size);
  validate_recompute(*this, pipeline_model_parallel_size);
  validate_moe(*this, tensor_model_parallel_size, expert_model_parallel_size, expert_tensor_parallel_size);
  const int64_t stages = static_cast<int64_t>(pipeline_model_parallel_size) *
                         static_cast<int64_t>(virtual_pipeline_model_parallel_size.value_or(1));
  require(num_layers % stages == 0, "model.num_layers (" + str(num_layers) +
                                        ") must be divisible by pipeline size x virtual pipeline size (" + str(stages) +
                                        ") so every model chunk holds the same number of layers");
}

}  // namespace bridge::models
