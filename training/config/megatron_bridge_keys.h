// Megatron-Bridge's spellings of bridge's config keys. Its ConfigContainer keeps the parallel sizes on `model`, names
// the logging section `logger`, the process-group settings `dist`, evaluation `validation`, and has a few fields that
// are bridge's with another name, unit or sense (dataset.seq_length, dist.distributed_timeout_minutes in minutes,
// checkpoint.load_optim for no_load_optim). config_yaml reads every key through translate_megatron_bridge_key, so
// Megatron-Bridge recipes and overrides load unchanged where they use what bridge has:
//
//   bridge-pretrain model.tensor_model_parallel_size=2 logger.tensorboard_dir=/tmp/tb dataset.seq_length=128 ...
//
// and --print-config shows what they set under bridge's own names. Hydra's instantiation keys (`_target_`, ...) and
// the fields Megatron-Bridge computes are read and have no effect; a feature bridge lacks is accepted only at the
// value that leaves it off (model.sequence_parallel: false), anything else is an error saying so.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace bridge::training {

/// A YAML value as the translation sees it: a plain null, a scalar's text, or anything else (a list or mapping).
struct KeyValue {
  enum class Kind { kNull, kScalar, kOther };
  Kind kind = Kind::kOther;
  std::string text;  ///< the scalar's text (kScalar only)
};

/// What a Megatron-Bridge key does in bridge.
struct KeyTranslation {
  /// The bridge key it sets; empty when reading it has no effect (nothing to set).
  std::string key;
  /// The value to set, as YAML, when it is not the one written (checkpoint.load_optim: true sets no_load_optim: false).
  std::optional<std::string> value;
  /// The value is Megatron-Bridge's blend, `[[prefix, ...], [weight, ...] or null]`, for bridge's `dataset.data_path`
  /// list in Megatron's form (`[weight, prefix, weight, prefix, ...]`, or the prefixes alone).
  bool blend = false;
  /// Megatron-Bridge lets this key win over the bridge key it sets, wherever the two are written
  /// (scheduler.start_weight_decay over optimizer.weight_decay: its scheduler rewrites the weight decay every step).
  bool overrides = false;
};

/// The translation of Megatron-Bridge's dotted `key` holding `value`, or nullopt when `key` is not one of its names
/// that bridge reads (bridge's own keys are not translated). Throws std::invalid_argument, naming the key and the fix,
/// for a key bridge reads but cannot honour at that value.
std::optional<KeyTranslation> translate_megatron_bridge_key(std::string_view key, const KeyValue& value);

/// Whether `path` is a section (or key prefix) only Megatron-Bridge spells: "logger", "dist", "validation".
bool is_megatron_bridge_section(std::string_view path);

/// The bridge spelling of `key`'s section where Megatron-Bridge names it differently ("logger.x" -> "logging.x"),
/// for suggestions on a misspelt key; `key` itself otherwise.
std::string to_bridge_section(std::string_view key);

}  // namespace bridge::training
