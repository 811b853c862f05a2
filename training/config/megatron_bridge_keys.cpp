// The table of Megatron-Bridge's key names (its ConfigContainer at NVIDIA-NeMo/Megatron-Bridge 067f987, whose
// sections mostly subclass Megatron-LM's megatron.training.config) and what each does in bridge.
#include "training/config/megatron_bridge_keys.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <stdexcept>
#include <utility>

#include "utils/strings.h"

namespace bridge::training {
namespace {

// A translation that sets bridge's `key` to the value as written.
KeyTranslation sets(std::string key) {
  KeyTranslation translation;
  translation.key = std::move(key);
  return translation;
}

using bridge::utils::to_lower;

enum class Rule {
  kRename,    // the same value under bridge's key
  kNegate,    // a bool meaning the opposite of bridge's key
  kMinutes,   // a whole number of minutes for bridge's duration
  kOverride,  // bridge's key, winning over a plain write of it
  kBlend,     // a [[prefixes], [weights]] blend for bridge's list
  kIgnore,    // read, no effect in bridge
  kOnly,      // a feature bridge lacks: accepted at `value`, the setting that leaves it off
};

struct Entry {
  std::string_view key;
  Rule rule;
  std::string_view target;    // kRename/kNegate/kMinutes/kOverride: bridge's key; kOnly: the accepted value
  std::string_view why = {};  // kOnly: what bridge does instead
};

constexpr std::string_view kCoreTokenizers =
    "bridge's tokenizers behave as megatron.core.tokenizers' (Llama2Tokenizer adds no BOS)";
constexpr std::string_view kNoTikToken = "bridge has no TikTokenizer; use its tokenizer.json as HuggingFaceTokenizer";
constexpr std::string_view kNoWsd =
    "bridge's scheduler has no WSD decay (scheduler.lr_decay_style: constant, linear, cosine, inverse-square-root)";
constexpr std::string_view kPreNorm = "bridge's transformer layers are pre-norm (the residual is the layer's input)";

constexpr Entry kEntries[] = {
    // The parallel sizes live on Megatron-Bridge's model provider.
    {"model.tensor_model_parallel_size", Rule::kRename, "parallelism.tensor_model_parallel_size"},
    {"model.pipeline_model_parallel_size", Rule::kRename, "parallelism.pipeline_model_parallel_size"},
    {"model.virtual_pipeline_model_parallel_size", Rule::kRename, "parallelism.virtual_pipeline_model_parallel_size"},
    {"model.microbatch_group_size_per_vp_stage", Rule::kRename, "parallelism.microbatch_group_size_per_vp_stage"},
    {"model.bf16", Rule::kRename, "mixed_precision.bf16"},
    {"model.fp16", Rule::kRename, "mixed_precision.fp16"},
    {"model.context_parallel_size", Rule::kRename, "parallelism.context_parallel_size"},
    {"model.expert_model_parallel_size", Rule::kRename, "parallelism.expert_model_parallel_size"},
    {"model.expert_tensor_parallel_size", Rule::kRename, "parallelism.expert_tensor_parallel_size"},
    // Transformer Engine's fused MoE kernels: the same arithmetic, which bridge runs as one GEMM per local expert.
    {"model.moe_grouped_gemm", Rule::kIgnore, ""},
    {"model.moe_permute_fusion", Rule::kIgnore, ""},
    {"model.moe_router_fusion", Rule::kIgnore, ""},
    {"model.moe_shared_expert_overlap", Rule::kOnly, "false",
     "bridge runs the shared experts before the router, as Megatron-Core without the overlap"},
    {"model.moe_input_jitter_eps", Rule::kOnly, "null", "bridge's router takes its input as it is"},
    {"model.moe_apply_probs_on_input", Rule::kOnly, "false", "bridge weighs the experts' outputs"},
    {"model.moe_layer_recompute", Rule::kOnly, "false", "use model.recompute_modules: [moe]"},
    {"model.moe_enable_deepep", Rule::kOnly, "false", "bridge's dispatchers are allgather and alltoall over c10d"},
    {"model.apply_residual_connection_post_layernorm", Rule::kOnly, "false", kPreNorm},
    {"model.distribute_saved_activations", Rule::kOnly, "false",
     "bridge keeps each checkpointed layer input whole on every tensor-parallel rank"},
    // Megatron-Bridge's init functions, normal(0, init_method_std) as bridge's, written as Hydra partials.
    {"model.init_method", Rule::kIgnore, ""},
    {"model.output_layer_init_method", Rule::kIgnore, ""},

    {"validation.eval_interval", Rule::kRename, "train.eval_interval"},
    {"validation.eval_iters", Rule::kRename, "train.eval_iters"},
    {"validation.skip_train", Rule::kRename, "train.skip_train"},
    {"train.rampup_batch_size", Rule::kOnly, "null", "bridge's global batch size is constant"},

    {"optimizer.bf16", Rule::kRename, "mixed_precision.bf16"},
    {"optimizer.fp16", Rule::kRename, "mixed_precision.fp16"},
    {"optimizer.loss_scale", Rule::kRename, "mixed_precision.loss_scale"},
    {"optimizer.initial_loss_scale", Rule::kRename, "mixed_precision.initial_loss_scale"},
    {"optimizer.min_loss_scale", Rule::kRename, "mixed_precision.min_loss_scale"},
    {"optimizer.hysteresis", Rule::kRename, "mixed_precision.hysteresis"},
    {"ddp.check_for_nan_in_grad", Rule::kRename, "train.check_for_nan_in_loss_and_grad"},

    // Megatron-Bridge's scheduler sets the weight decay at every step, over what the optimizer was built with.
    {"scheduler.start_weight_decay", Rule::kOverride, "optimizer.weight_decay"},
    {"scheduler.end_weight_decay", Rule::kOverride, "optimizer.weight_decay"},
    {"scheduler.weight_decay_incr_style", Rule::kOnly, "constant", "bridge's weight decay is constant"},
    {"scheduler.lr_warmup_init", Rule::kOnly, "0", "bridge's warmup starts from a learning rate of 0"},
    // Warmup-stable-decay (lr_decay_style WSD), which bridge's scheduler lacks; the style is read only under WSD.
    {"scheduler.lr_wsd_decay_iters", Rule::kOnly, "null", kNoWsd},
    {"scheduler.lr_wsd_decay_samples", Rule::kOnly, "null", kNoWsd},
    {"scheduler.lr_wsd_decay_style", Rule::kIgnore, ""},
    // Computed by Megatron-Bridge from the iterations (or samples) and batch size; written in its YAML dumps.
    {"scheduler.lr_decay_steps", Rule::kIgnore, ""},
    {"scheduler.lr_warmup_steps", Rule::kIgnore, ""},
    {"scheduler.wd_incr_steps", Rule::kIgnore, ""},
    {"scheduler.wsd_decay_steps", Rule::kIgnore, ""},

    {"dataset.blend", Rule::kBlend, "dataset.data_path"},
    {"dataset.seq_length", Rule::kRename, "model.seq_length"},
    {"dataset.sequence_length", Rule::kRename, "model.seq_length"},
    {"dataset.random_seed", Rule::kRename, "rng.seed"},
    {"dataset.dataloader_type", Rule::kOnly, "single", "bridge reads the samples in megatron-core's order, once"},
    {"dataset.split_matrix", Rule::kIgnore, ""},
    {"dataset.tokenizer", Rule::kIgnore, ""},
    {"dataset.mock", Rule::kIgnore, ""},  // an empty dataset.data_path is mock data
    {"dataset.num_workers", Rule::kIgnore, ""},
    {"dataset.pin_memory", Rule::kIgnore, ""},
    {"dataset.persistent_workers", Rule::kIgnore, ""},
    {"dataset.data_sharding", Rule::kIgnore, ""},
    {"dataset.mmap_bin_files", Rule::kIgnore, ""},
    {"dataset.num_dataset_builder_threads", Rule::kIgnore, ""},

    // The tokenizer section is bridge's too (tokenizer_type, tokenizer_model, vocab_file, merge_file, vocab_size,
    // use_tokenizer_vocab_size); these are its other fields.
    {"tokenizer.legacy_tokenizer", Rule::kOnly, "false", kCoreTokenizers},
    {"tokenizer.vocab_extra_ids", Rule::kOnly, "0", "bridge's tokenizers add no extra ids (T5's span masking)"},
    {"tokenizer.special_tokens", Rule::kOnly, "null", "bridge takes special tokens from the tokenizer's own files"},
    {"tokenizer.tiktoken_pattern", Rule::kOnly, "null", kNoTikToken},
    {"tokenizer.tiktoken_special_tokens", Rule::kOnly, "null", kNoTikToken},
    {"tokenizer.tiktoken_num_special_tokens", Rule::kIgnore, ""},  // read by TikTokenizer only
    {"tokenizer.image_tag_type", Rule::kOnly, "null", "bridge's tokenizers are text only"},
    // Chat formatting (fine-tuning prompts), which pretraining on prepared token ids never applies.
    {"tokenizer.tokenizer_prompt_format", Rule::kIgnore, ""},
    {"tokenizer.chat_template", Rule::kIgnore, ""},
    {"tokenizer.chat_template_path", Rule::kIgnore, ""},
    {"tokenizer.force_system_message", Rule::kIgnore, ""},
    // Options of transformers' AutoTokenizer and of the sentencepiece module; bridge reads the files itself.
    {"tokenizer.hf_tokenizer_kwargs", Rule::kIgnore, ""},
    {"tokenizer.sp_tokenizer_kwargs", Rule::kIgnore, ""},
    {"tokenizer.metadata_path", Rule::kIgnore, ""},
    // Megatron-Bridge's own bookkeeping: the model pads the vocabulary (model.make_vocab_size_divisible_by).
    {"tokenizer.padded_vocab_size", Rule::kIgnore, ""},
    {"tokenizer.make_vocab_size_divisible_by", Rule::kIgnore, ""},
    {"tokenizer.tensor_model_parallel_size", Rule::kIgnore, ""},
    {"tokenizer.rank", Rule::kIgnore, ""},

    {"checkpoint.load_optim", Rule::kNegate, "checkpoint.no_load_optim"},
    {"checkpoint.load_rng", Rule::kNegate, "checkpoint.no_load_rng"},

    {"dist.distributed_backend", Rule::kRename, "parallelism.backend"},
    {"dist.distributed_timeout_minutes", Rule::kMinutes, "parallelism.timeout"},
    {"dist.local_rank", Rule::kIgnore, ""},  // the launcher's LOCAL_RANK
};

// Sections bridge has no counterpart for: accepted when empty (null), as Megatron-Bridge's dumps write them.
constexpr std::pair<std::string_view, std::string_view> kAbsentSections[] = {
    {"comm_overlap", "bridge overlaps the gradient all-reduce through ddp.overlap_grad_reduce"},
    {"ft", "bridge has no fault-tolerance service"},
    {"straggler", "bridge has no straggler detection"},
    {"nvrx_straggler", "bridge has no straggler detection"},
    {"inprocess_restart", "bridge restarts through the launcher"},
    {"peft", "bridge pretrains every parameter"},
    {"profiling", "use callbacks: [{type: Profiler, start_step: 10, num_steps: 2}]"},
    {"tensor_inspect", "bridge has no tensor inspection"},
    {"rerun_state_machine", "bridge fails on a non-finite loss (train.check_for_nan_in_loss_and_grad)"},
    {"env_vars", "set the environment before launching"},
    {"optimizer_config_override_provider", "bridge takes one optimizer config"},
};

// Megatron-Bridge's section names for bridge's (whole sections renamed key for key).
constexpr std::pair<std::string_view, std::string_view> kSectionRenames[] = {{"logger", "logging"}};

// Sections whose keys Megatron-Bridge spells under other names (listed in kEntries one by one).
constexpr std::string_view kPartialSections[] = {"validation", "dist"};

// Hydra's instantiation keys, written at every level of Megatron-Bridge's YAML dumps.
constexpr std::string_view kHydraKeys[] = {"_target_", "_call_", "_partial_", "_args_", "_recursive_"};

std::optional<double> number(std::string_view text) {
  double value = 0.0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<bool> boolean(std::string_view text) {
  const std::string word = to_lower(text);
  if (word == "true" || word == "yes" || word == "on") return true;
  if (word == "false" || word == "no" || word == "off") return false;
  return std::nullopt;
}

// Whether `value` is `expected` as YAML reads it: the same bool, number or (case-insensitive) name.
bool same_value(const KeyValue& value, std::string_view expected) {
  if (expected == "null") return value.kind == KeyValue::Kind::kNull;
  if (value.kind != KeyValue::Kind::kScalar) return false;
  if (const auto want = boolean(expected)) return boolean(value.text) == want;
  if (const auto want = number(expected)) return number(value.text) == want;
  return to_lower(value.text) == to_lower(expected);
}

std::string shown(const KeyValue& value) {
  switch (value.kind) {
    case KeyValue::Kind::kNull:
      return "null";
    case KeyValue::Kind::kScalar:
      return value.text;
    case KeyValue::Kind::kOther:
      break;
  }
  return "a list or mapping";
}

std::string_view leaf_of(std::string_view key) { return key.substr(key.rfind('.') + 1); }

}  // namespace

std::optional<KeyTranslation> translate_megatron_bridge_key(std::string_view key, const KeyValue& value) {
  if (std::find(std::begin(kHydraKeys), std::end(kHydraKeys), leaf_of(key)) != std::end(kHydraKeys)) {
    return KeyTranslation{};
  }
  for (const auto& [section, why] : kAbsentSections) {
    if (key != section) continue;
    if (value.kind == KeyValue::Kind::kNull) return KeyTranslation{};
    throw std::invalid_argument("Megatron-Bridge's '" + std::string(key) + "' section has no counterpart in bridge (" +
                                std::string(why) + "); remove it or set it to null");
  }
  for (const Entry& entry : kEntries) {
    if (entry.key != key) continue;
    // A null is Megatron-Bridge's "unset": the default of what the key sets (or, for a feature bridge lacks, off).
    if (value.kind == KeyValue::Kind::kNull && entry.rule != Rule::kIgnore) {
      KeyTranslation translation = sets(entry.rule == Rule::kOnly ? std::string() : std::string(entry.target));
      translation.overrides = entry.rule == Rule::kOverride;
      return translation;
    }
    switch (entry.rule) {
      case Rule::kRename:
        return sets(std::string(entry.target));
      case Rule::kBlend: {
        KeyTranslation translation = sets(std::string(entry.target));
        translation.blend = true;
        return translation;
      }
      case Rule::kOverride: {
        KeyTranslation translation = sets(std::string(entry.target));
        translation.overrides = true;
        return translation;
      }
      case Rule::kIgnore:
        return KeyTranslation{};
      case Rule::kNegate: {
        const std::optional<bool> flag =
            value.kind == KeyValue::Kind::kScalar ? boolean(value.text) : std::optional<bool>();
        if (!flag) throw std::invalid_argument(std::string(key) + " must be a bool, got " + shown(value));
        return KeyTranslation{std::string(entry.target), *flag ? "false" : "true"};
      }
      case Rule::kMinutes: {
        const std::optional<double> minutes =
            value.kind == KeyValue::Kind::kScalar ? number(value.text) : std::optional<double>();
        if (!minutes || *minutes <= 0 || *minutes != static_cast<double>(static_cast<int64_t>(*minutes))) {
          throw std::invalid_argument(std::string(key) + " must be a whole number of minutes, got " + shown(value));
        }
        return KeyTranslation{std::string(entry.target), std::to_string(static_cast<int64_t>(*minutes)) + "min", false};
      }
      case Rule::kOnly:
        if (same_value(value, entry.target)) return KeyTranslation{};
        throw std::invalid_argument("Megatron-Bridge's " + std::string(key) + "=" + shown(value) +
                                    " is not supported: " + std::string(entry.why) + "; set it to " +
                                    std::string(entry.target) + " or remove it");
    }
  }
  for (const auto& [theirs, ours] : kSectionRenames) {
    if (key.size() > theirs.size() && key.substr(0, theirs.size()) == theirs && key[theirs.size()] == '.') {
      return sets(std::string(ours) + std::string(key.substr(theirs.size())));
    }
  }
  return std::nullopt;
}

bool is_megatron_bridge_section(std::string_view path) {
  for (const auto& [theirs, ours] : kSectionRenames) {
    if (path == theirs) return true;
  }
  return std::find(std::begin(kPartialSections), std::end(kPartialSections), path) != std::end(kPartialSections);
}

std::string to_bridge_section(std::string_view key) {
  for (const auto& [theirs, ours] : kSectionRenames) {
    if (key.size() > theirs.size() && key.substr(0, theirs.size()) == theirs && key[theirs.size()] == '.') {
      return std::string(ours) + std::string(key.substr(theirs.size()));
    }
  }
  return std::string(key);
}

}  // namespace bridge::training
