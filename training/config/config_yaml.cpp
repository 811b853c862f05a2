// ConfigContainer from YAML: recipes, overrides (with Megatron-Bridge's names and Hydra's forms) and the callbacks
// list, applied through the key table (config_table.h); and back to YAML (to_yaml, --print-config).
#include "training/config/config_yaml.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>

#include "training/callbacks/registry.h"
#include "training/config/config_table.h"
#include "training/config/megatron_bridge_keys.h"
#include "utils/closest_match.h"
#include "utils/strings.h"

namespace bridge::training {
namespace {

using detail::Codec;
using detail::emit_value;
using detail::Field;
using detail::fields;
using detail::find_field;
using detail::is_null;
using detail::is_section;
using detail::leaf_of;
using detail::milliseconds;
using detail::section_of;
using detail::sections;
using detail::yaml_text;
using utils::trim;

// Where a node came from: "recipe.yaml:12:3", or the override for nodes parsed from one.
struct Source {
  std::string name;
  bool has_lines = true;

  std::string at(const YAML::Node& node) const {
    const YAML::Mark mark = node.Mark();
    if (!has_lines || mark.is_null()) return name;
    return name + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
  }
};

std::string describe(const YAML::Node& node) {
  if (is_null(node)) return "null (no value)";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "'" + node.Scalar() + "'";
}

// A `callbacks:` list: entries {type: <built-in>, <option>: <value>, ...}, each checked against its type.
std::vector<CallbackConfig> parse_callbacks(const YAML::Node& list, const Source& source) {
  std::vector<CallbackConfig> entries;
  if (is_null(list)) return entries;
  if (!list.IsSequence()) {
    throw ConfigError(source.at(list) +
                      ": callbacks must be a list of {type: <name>, <option>: <value>} entries, e.g. "
                      "[{type: EarlyStopping, patience: 3}], got " +
                      describe(list));
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    const YAML::Node item = list[i];
    const std::string where = "callbacks[" + std::to_string(i) + "]";
    if (!item.IsMap()) {
      throw ConfigError(source.at(item) + ": " + where + " must be a mapping {type: <name>, ...}, got " +
                        describe(item));
    }
    CallbackConfig entry;
    for (auto it = item.begin(); it != item.end(); ++it) {
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      if (!key.IsScalar()) throw ConfigError(source.at(key) + ": keys must be names, got " + describe(key));
      const std::string name = key.Scalar();
      if (name == "type") {
        if (!value.IsScalar()) throw ConfigError(source.at(value) + ": " + where + ".type must be a name");
        entry.type = value.Scalar();
      } else if (!entry.options.emplace(name, yaml_text(value)).second) {
        throw ConfigError(source.at(key) + ": " + where + "." + name + " is set twice; keep one");
      }
    }
    try {
      validate_callback_config(entry, where, /*load_plugins=*/false);  // ConfigContainer::validate loads them
    } catch (const std::invalid_argument& error) {
      throw ConfigError(source.at(item) + ": " + error.what());
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::string a_or_an(const std::string& noun) {
  return (noun.empty() || std::string_view("aeiou").find(noun[0]) == std::string_view::npos ? "a " : "an ") + noun;
}

// The key whose leaf is `path`'s, in another section or none ("global_batch_size", "model.train_iters"), the nearest
// in spelling when several sections have it ("train.vocab_size": model's, not tokenizer's).
std::optional<std::string> same_leaf_key(const std::string& path) {
  std::optional<std::string> best;
  std::size_t best_distance = 0;
  for (const Field& f : fields()) {
    if (leaf_of(f.key) != leaf_of(path)) continue;
    const std::size_t distance = utils::edit_distance(path, f.key);
    if (!best || distance < best_distance) {
      best = f.key;
      best_distance = distance;
    }
  }
  return best;
}

std::string unknown_key_message(const std::string& written) {
  // Megatron-Bridge's section names suggest bridge's keys: "logger.tensorbord_dir" -> "logging.tensorboard_dir".
  const std::string path = to_bridge_section(written);
  // A key's exact name under the wrong section is a likelier slip than a near spelling in this one:
  // train.log_interval is logging.log_interval, not train.eval_interval.
  std::optional<std::string> suggestion = same_leaf_key(path);
  if (!suggestion) {
    std::vector<std::string_view> keys;
    for (const Field& f : fields()) keys.push_back(f.key);
    suggestion = utils::closest_match(path, keys);
  }
  if (!suggestion) {
    std::vector<std::string_view> leaves;
    for (const Field& f : fields()) leaves.push_back(leaf_of(f.key));
    if (std::optional<std::string> leaf = utils::closest_match(leaf_of(path), leaves)) {
      for (const Field& f : fields()) {
        if (leaf_of(f.key) == *leaf) {
          suggestion = f.key;
          break;
        }
      }
    }
  }
  std::string message = "unknown config key '" + written + "'";
  if (suggestion) {
    message += "; did you mean '" + *suggestion + "'?";
  } else if (const std::string section(section_of(path)); is_section(section)) {
    std::vector<std::string_view> in_section;
    for (const Field& f : fields()) {
      if (section_of(f.key) == section) in_section.push_back(f.key);
    }
    message += "; the keys of '" + section + "' are " + utils::join(in_section, ", ");
  } else {
    message += "; the sections are " + utils::join(sections(), ", ");
  }
  return message + " (bridge-pretrain --help lists every key)";
}

void set_field(const Field& f, ConfigContainer& config, const YAML::Node& value, const Source& source) {
  bool parsed = false;
  try {
    parsed = f.parse(config, value);
  } catch (const std::invalid_argument& refused) {  // a value the codec knows and refuses, with its reason
    throw ConfigError(source.at(value) + ": " + f.key + ": " + refused.what());
  }
  if (!parsed) {
    std::string expected = a_or_an(f.type);
    if (f.type == "duration") expected += " with a unit (ms, s, min, h), e.g. 30s or 10min";
    throw ConfigError(source.at(value) + ": " + f.key + " must be " + expected + ", got " + describe(value));
  }
}

// How a document set a key so far, to tell a key set twice from Megatron-Bridge's two spellings of one value.
struct Written {
  std::string as;     // the key as written: "dataset.seq_length"
  std::string value;  // the value it left, as to_yaml writes it
  bool overrides = false;
  bool reset = false;  // a null put it back to its default ("not given"); another spelling may still set it
};
using WrittenKeys = std::map<std::string, Written>;  // by bridge's key

// Sets `f` from `value`, written as `as`. A plain null on a field that takes no null means "the default" (as in
// Megatron-Bridge, where null leaves a field to be derived): it resets a field this document has not set and is
// otherwise ignored. Two spellings of one key (model.seq_length and dataset.seq_length) must agree, unless one of
// them is Megatron-Bridge's overriding key, which wins.
void set_written(const Field& f, ConfigContainer& config, const YAML::Node& value, const Source& source,
                 const YAML::Node& key, const std::string& as, bool overrides, WrittenKeys& written) {
  const auto previous = written.find(f.key);
  const bool set_before = previous != written.end() && !previous->second.reset;
  if (set_before) {
    if (previous->second.as == as) throw ConfigError(source.at(key) + ": " + as + " is set twice; keep one");
    if (previous->second.overrides && !overrides) return;
  }
  if (is_null(value) && !f.takes_null) {
    if (previous == written.end()) {
      f.reset(config);
      written.emplace(f.key, Written{as, std::string(), false, /*reset=*/true});
    }
    return;
  }
  set_field(f, config, value, source);
  Written now{as, emit_value(f, config), overrides};
  if (!set_before) {
    written[f.key] = std::move(now);
  } else if (overrides && !previous->second.overrides) {
    previous->second = std::move(now);
  } else if (now.value != previous->second.value) {
    throw ConfigError(source.at(key) + ": " + as + ": " + now.value + " disagrees with " + previous->second.as + ": " +
                      previous->second.value + "; both set " + f.key + ", keep one");
  }
}

KeyValue key_value(const YAML::Node& node) {
  if (is_null(node)) return {KeyValue::Kind::kNull, ""};
  if (node.IsScalar()) return {KeyValue::Kind::kScalar, node.Scalar()};
  return {KeyValue::Kind::kOther, ""};
}

// Megatron-Bridge's dataset.blend, [[prefix, ...], [weight, ...] or null], as Megatron's data_path list:
// [weight, prefix, ...], or the prefixes alone when there are no weights.
YAML::Node data_path_of_blend(const YAML::Node& blend, const std::string& path, const Source& source) {
  if (is_null(blend)) return blend;
  const auto fail = [&] {
    throw ConfigError(source.at(blend) + ": " + path +
                      " must be [[prefix, ...], [weight, ...]] or [[prefix, ...], null], as Megatron-Bridge's "
                      "get_blend_from_list writes it; got " +
                      describe(blend));
  };
  if (!blend.IsSequence() || blend.size() < 1 || blend.size() > 2 || !blend[0].IsSequence()) fail();
  const YAML::Node prefixes = blend[0];
  const YAML::Node weights = blend.size() == 2 ? blend[1] : YAML::Node();
  if (!is_null(weights) && (!weights.IsSequence() || weights.size() != prefixes.size())) fail();
  YAML::Node list(YAML::NodeType::Sequence);
  for (std::size_t i = 0; i < prefixes.size(); ++i) {
    if (!prefixes[i].IsScalar() || (!is_null(weights) && !weights[i].IsScalar())) fail();
    if (!is_null(weights)) list.push_back(weights[i].Scalar());
    list.push_back(prefixes[i].Scalar());
  }
  return list;
}

// Megatron-Bridge's name for a key, translated (nullopt: not one of its names).
std::optional<KeyTranslation> translate(const std::string& path, const YAML::Node& key, const YAML::Node& value,
                                        const Source& source) {
  try {
    return translate_megatron_bridge_key(path, key_value(value));
  } catch (const std::invalid_argument& error) {
    throw ConfigError(source.at(key) + ": " + error.what());
  }
}

void apply_map(ConfigContainer& config, const YAML::Node& map, const std::string& prefix, const Source& source,
               WrittenKeys& written) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    // Copies: yaml-cpp's iterator hands out a temporary pair, so references to its members would dangle.
    const YAML::Node key = it->first;
    const YAML::Node value = it->second;
    if (!key.IsScalar()) throw ConfigError(source.at(key) + ": keys must be names, got " + describe(key));
    const std::string path = prefix.empty() ? key.Scalar() : prefix + "." + key.Scalar();
    const auto once = [&] {
      if (written.count(path) != 0) throw ConfigError(source.at(key) + ": " + path + " is set twice; keep one");
      written.emplace(path, Written{path, std::string(), false});
    };
    if (const Field* f = find_field(path)) {
      set_written(*f, config, value, source, key, path, /*overrides=*/false, written);
    } else if (path == "mixed_precision" && value.IsScalar()) {
      // Megatron-Bridge's ConfigContainer.mixed_precision also takes a recipe name.
      once();
      try {
        apply_mixed_precision_recipe(config.mixed_precision, value.Scalar());
      } catch (const std::invalid_argument& error) {
        throw ConfigError(source.at(value) + ": " + error.what());
      }
    } else if (path == "callbacks") {
      once();
      config.callbacks = parse_callbacks(value, source);
    } else if (const std::optional<KeyTranslation> translation = translate(path, key, value, source)) {
      if (translation->key.empty()) continue;  // read; no effect in bridge
      const Field* target = find_field(translation->key);
      if (target == nullptr) throw ConfigError(source.at(key) + ": " + unknown_key_message(path));
      const YAML::Node node = translation->blend               ? data_path_of_blend(value, path, source)
                              : translation->value.has_value() ? YAML::Load(*translation->value)
                                                               : value;
      set_written(*target, config, node, source, key, path, translation->overrides, written);
    } else if (is_section(path) || is_megatron_bridge_section(path)) {
      if (is_null(value)) continue;  // a section with every key commented out
      if (!value.IsMap()) {
        throw ConfigError(source.at(key) + ": '" + path + "' is a section, not a value; set its keys (" + path +
                          ".<key>), got " + describe(value));
      }
      apply_map(config, value, path, source, written);
    } else {
      throw ConfigError(source.at(key) + ": " + unknown_key_message(path));
    }
  }
}

YAML::Node parse_yaml(std::string_view text, const std::string& source_name) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& error) {
    std::string where = source_name;
    if (!error.mark.is_null()) {
      where += ":" + std::to_string(error.mark.line + 1) + ":" + std::to_string(error.mark.column + 1);
    }
    throw ConfigError(where + ": bad YAML: " + error.msg);
  }
}

}  // namespace

template <class T>
T parse_config_value(std::string_view text, std::string_view where) {
  const YAML::Node node = parse_yaml(text, std::string(where));
  std::optional<T> value;
  try {
    value = Codec<T>::parse(node);
  } catch (const std::invalid_argument& refused) {
    throw ConfigError(std::string(where) + ": " + refused.what());
  }
  if (!value) {
    std::string expected = a_or_an(Codec<T>::type());
    if (Codec<T>::type() == "duration") expected += " with a unit (ms, s, min, h), e.g. 30s or 10min";
    throw ConfigError(std::string(where) + " must be " + expected + ", got " + describe(node));
  }
  return std::move(*value);
}

template <class T>
std::string config_value_type() {
  return Codec<T>::type();
}

template <class T>
std::string config_value_text(const T& value) {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  Codec<T>::emit(out, value);
  return out.c_str();
}

#define BRIDGE_CONFIG_VALUE(T)                                          \
  template T parse_config_value<T>(std::string_view, std::string_view); \
  template std::string config_value_type<T>();                          \
  template std::string config_value_text<T>(const T&);
BRIDGE_CONFIG_VALUE(int)
BRIDGE_CONFIG_VALUE(int64_t)
BRIDGE_CONFIG_VALUE(double)
BRIDGE_CONFIG_VALUE(bool)
BRIDGE_CONFIG_VALUE(std::string)
BRIDGE_CONFIG_VALUE(milliseconds)
BRIDGE_CONFIG_VALUE(std::vector<std::string>)
BRIDGE_CONFIG_VALUE(std::vector<int64_t>)
BRIDGE_CONFIG_VALUE(std::optional<int64_t>)
BRIDGE_CONFIG_VALUE(std::optional<double>)
BRIDGE_CONFIG_VALUE(std::optional<bool>)
#undef BRIDGE_CONFIG_VALUE

void merge_config_yaml(ConfigContainer& config, std::string_view text, std::string_view source) {
  const Source origin{std::string(source)};
  const YAML::Node root = parse_yaml(text, origin.name);
  if (is_null(root)) return;  // an empty file (or only comments): the config as it is
  if (!root.IsMap()) {
    throw ConfigError(origin.at(root) + ": the top level must be a mapping of sections (" +
                      utils::join(sections(), ":, ") + ":), got " + describe(root));
  }
  WrittenKeys written;
  apply_map(config, root, "", origin, written);
}

ConfigContainer load_config_yaml_string(std::string_view text, std::string_view source) {
  ConfigContainer config;
  merge_config_yaml(config, text, source);
  return config;
}

ConfigContainer load_config_yaml(const std::filesystem::path& path) {
  // A directory opens as a stream that reads nothing, which would train the defaults; a pipe (<(...)) is fine.
  std::error_code status_error;
  const std::filesystem::file_status status = std::filesystem::status(path, status_error);
  if (std::filesystem::is_directory(status)) {
    throw ConfigError("the config file '" + path.string() +
                      "' is a directory; pass the YAML recipe itself, e.g. --config " +
                      (path / "recipe.yaml").string());
  }
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
      !std::filesystem::is_fifo(status) && !std::filesystem::is_character_file(status)) {
    throw ConfigError("the config file '" + path.string() + "' is not a regular file; pass a YAML recipe");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw ConfigError("cannot read the config file '" + path.string() +
                      "': " + std::error_code(errno, std::generic_category()).message());
  }
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) {
    throw ConfigError("cannot read the config file '" + path.string() +
                      "': " + std::error_code(errno, std::generic_category()).message());
  }
  return load_config_yaml_string(text.str(), path.string());
}

OverriddenKeys apply_override(ConfigContainer& config, std::string_view assignment) {
  const Source origin{"override '" + std::string(assignment) + "'", /*has_lines=*/false};
  // Hydra's forms, as Megatron-Bridge's scripts take them: +key=value and ++key=value set the key (bridge's keys all
  // exist already); ~key unsets it: back to its default, and out of the keys the user set.
  std::string_view text = trim(assignment);
  const bool reset = !text.empty() && text.front() == '~';
  if (reset) {
    text.remove_prefix(1);
  } else {
    while (!text.empty() && text.front() == '+') text.remove_prefix(1);
  }
  const std::size_t equals = text.find('=');
  const std::string key(trim(text.substr(0, equals)));
  if (reset) {
    const Field* f = find_field(key);
    if (f == nullptr) {
      const std::optional<KeyTranslation> translation =
          translate_megatron_bridge_key(key, KeyValue{KeyValue::Kind::kNull, std::string()});
      if (!translation) throw ConfigError(origin.name + ": " + unknown_key_message(key));
      if (translation->key.empty()) return {};  // nothing in bridge to put back
      f = find_field(translation->key);
      if (f == nullptr) throw ConfigError(origin.name + ": " + unknown_key_message(key));
    }
    f->reset(config);
    return OverriddenKeys{{}, {f->key}};
  }
  if (equals == std::string_view::npos || key.empty()) {
    throw ConfigError(origin.name + ": an override is key=value, e.g. train.train_iters=100 (keys: --help)");
  }
  YAML::Node map(YAML::NodeType::Map);
  map[key] = parse_yaml(text.substr(equals + 1), origin.name);
  WrittenKeys written;
  apply_map(config, map, "", origin, written);
  OverriddenKeys keys;
  for (const auto& [name, how] : written) {
    if (find_field(name) != nullptr) {
      (how.reset ? keys.unset : keys.set).push_back(name);
    } else if (is_section(name)) {  // a section set whole by name (mixed_precision=bf16_mixed): all its keys
      for (const Field& f : fields()) {
        if (section_of(f.key) == name) keys.set.push_back(f.key);
      }
    }
  }
  return keys;
}

std::set<std::string> apply_overrides(ConfigContainer& config, const std::vector<std::string>& assignments) {
  std::set<std::string> user_keys;
  for (const std::string& assignment : assignments) {
    const OverriddenKeys keys = apply_override(config, assignment);
    for (const std::string& key : keys.unset) user_keys.erase(key);
    user_keys.insert(keys.set.begin(), keys.set.end());
  }
  return user_keys;
}

std::string to_yaml(const ConfigContainer& config) {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  out << YAML::BeginMap;
  std::string_view open_section;
  for (const Field& f : fields()) {
    const std::string_view section = section_of(f.key);
    if (section != open_section) {
      if (!open_section.empty()) out << YAML::EndMap;
      out << YAML::Key << std::string(section) << YAML::Value << YAML::BeginMap;
      open_section = section;
    }
    out << YAML::Key << std::string(leaf_of(f.key)) << YAML::Value;
    f.emit(out, config);
  }
  if (!open_section.empty()) out << YAML::EndMap;
  out << YAML::Key << "callbacks" << YAML::Value;
  if (config.callbacks.empty()) out << YAML::Flow;  // "callbacks: []"
  out << YAML::BeginSeq;
  for (const CallbackConfig& entry : config.callbacks) {
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "type" << YAML::Value << entry.type;
    for (const auto& [name, text] : entry.options) out << YAML::Key << name << YAML::Value << YAML::Load(text);
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace bridge::training
