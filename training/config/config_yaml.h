// ConfigContainer as YAML: recipes, "a.b.c=value" overrides (Megatron-Bridge / Hydra style), the resolved config
// and the key reference, all driven by one table of every user-settable field (config_keys()).
//
//   train:
//     global_batch_size: 32        # recipe.yaml; keys left out keep their defaults
//   model: {num_layers: 4, hidden_size: 128}
//
//   ConfigContainer config = load_config_yaml("recipe.yaml");
//   apply_override(config, "optimizer.lr=3e-4");
//   apply_override(config, "dataset.data_path=[/data/a_text_document, /data/b_text_document]");
//   std::cout << to_yaml(config);  // load_config_yaml_string(to_yaml(config)) gives config back
//
// Megatron-Bridge's ConfigContainer names are read too (logger.*, dist.*, model.tensor_model_parallel_size,
// dataset.seq_length, ...; training/config/megatron_bridge_keys.h): two spellings of one key in a document must agree.
// A null sets a key that takes none to its default, as Megatron-Bridge's null leaves a field to be derived. Unknown
// keys, wrong types and bad YAML throw ConfigError naming the key (or file:line) and the closest valid key;
// combinations that cannot work are left to ConfigContainer::validate. A top-level `callbacks:` list names built-in
// callbacks with their options (training/callbacks/registry.h), checked the same way:
//
//   callbacks:
//     - {type: EarlyStopping, monitor: lm loss validation, patience: 3}
#pragma once

#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "training/config/config.h"

namespace bridge::training {

/// A config that cannot be read: an unknown key, a value of the wrong type, bad YAML or an unreadable file. The
/// message says where (file:line or the override) and how to fix it.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// One user-settable field of ConfigContainer.
struct ConfigKeyInfo {
  std::string key;   ///< dotted, section first: "train.global_batch_size"
  std::string type;  ///< as users write it: "int", "float", "bool", "string", "list of strings", "duration", ...
  std::string doc;
};

/// Every user-settable key, section by section in the order of config.h. dataset.provider (code, not data) is not
/// one of them.
std::vector<ConfigKeyInfo> config_keys();

/// The defaults with the YAML file at `path` applied on top.
ConfigContainer load_config_yaml(const std::filesystem::path& path);
/// The defaults with YAML `text` applied on top; `source` names the text in errors (a file name, "<tiny recipe>").
ConfigContainer load_config_yaml_string(std::string_view text, std::string_view source = "<yaml>");
/// Applies the keys present in YAML `text` to `config`, leaving every other field as it is. Sections nest
/// (`train: {train_iters: 5}`) or keys may be dotted (`train.train_iters: 5`); a key set twice is an error.
void merge_config_yaml(ConfigContainer& config, std::string_view text, std::string_view source = "<yaml>");

/// The keys an override changed, under bridge's names: those it set, and those it put back to "not given".
struct OverriddenKeys {
  std::vector<std::string> set;
  std::vector<std::string> unset;
};

/// Applies one override "a.b.c=value"; the value is read as YAML: `5`, `3e-4`, `true`, `[a, b]`, `null` (optional
/// fields; elsewhere the default), `10min` (durations), or a string. A section may be set as a whole:
/// `model={num_layers: 2}`. Hydra's `+a.b=value` and `++a.b=value` set the key too; `~a.b` unsets it: back to its
/// default, and no longer the user's choice (as `a.b=null` on a key that takes no null). Keys may be Megatron-Bridge's
/// names (training/config/megatron_bridge_keys.h): `model.tensor_model_parallel_size=2`.
OverriddenKeys apply_override(ConfigContainer& config, std::string_view assignment);

/// Applies `assignments` in order and returns the keys the user set with them and left set (a later `~key` takes one
/// out). What gives way to a recipe but not to the user asks it: an hf:<dir> start's config.json
/// (adopt_hf_architecture in training/config/hf_start.h).
std::set<std::string> apply_overrides(ConfigContainer& config, const std::vector<std::string>& assignments);

/// A value written in YAML (`3`, `0.5`, `true`, `10min`, `[a, b]`, `null`) read as T the way config keys are read;
/// throws ConfigError "<where> must be <a type>, got <the value>". T is int, int64_t, double, bool, std::string,
/// std::chrono::milliseconds (a duration with its unit), std::vector of std::string or int64_t, or std::optional of
/// int64_t, double or bool. The callbacks' options are read with it (training/callbacks/registry.h).
template <class T>
T parse_config_value(std::string_view text, std::string_view where);
/// T's name in --help: "int", "float", "duration", "float or null", ...
template <class T>
std::string config_value_type();
/// `value` as the YAML text to_yaml writes; parse_config_value reads it back.
template <class T>
std::string config_value_text(const T& value);

/// Every user-settable key of `config` as YAML, section by section; loading it gives the same config back.
std::string to_yaml(const ConfigContainer& config);

/// The key reference: every key with its type, its value in `defaults` and its doc, grouped by section, then the
/// built-in callbacks a `callbacks:` list may name, with their options.
std::string config_help(const ConfigContainer& defaults = {});
/// The same reference as Markdown, one table per section (docs/config-reference.md is its output).
std::string config_reference_markdown(const ConfigContainer& defaults = {});

}  // namespace bridge::training
