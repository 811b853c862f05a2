// The one table of every user-settable config key: each row binds a dotted key ("train.train_iters") to a
// ConfigContainer member through member pointers and the codec of its type (config_codecs.h), so YAML recipes,
// overrides, --print-config, --help and the Markdown reference all read and write the same fields the same way.
// Internal to the config files; users see it through config_yaml.h (config_keys(), to_yaml(), ...).
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "training/config/config.h"
#include "training/config/config_codecs.h"

namespace bridge::training::detail {

struct Field {
  std::string key;
  std::string type;
  std::string doc;
  std::function<void(YAML::Emitter&, const ConfigContainer&)> emit;
  /// false when the node is not of the field's type (the config is then unchanged).
  std::function<bool(ConfigContainer&, const YAML::Node&)> parse;
  /// Sets the field back to its default.
  std::function<void(ConfigContainer&)> reset;
  /// Sets the field of the first config to its value in the second.
  std::function<void(ConfigContainer&, const ConfigContainer&)> copy;
  /// Whether a YAML null is one of its values (optionals, strings, lists); elsewhere null means the default.
  bool takes_null = false;
};

template <class Section, class T>
Field field(std::string key, Section ConfigContainer::*section, T Section::*member, std::string doc) {
  return Field{std::move(key),
               Codec<T>::type(),
               std::move(doc),
               [section, member](YAML::Emitter& out, const ConfigContainer& config) {
                 Codec<T>::emit(out, (config.*section).*member);
               },
               [section, member](ConfigContainer& config, const YAML::Node& node) {
                 std::optional<T> value = Codec<T>::parse(node);
                 if (!value) return false;
                 (config.*section).*member = std::move(*value);
                 return true;
               },
               [section, member](ConfigContainer& config) {
                 static const ConfigContainer defaults;
                 (config.*section).*member = (defaults.*section).*member;
               },
               [section, member](ConfigContainer& to, const ConfigContainer& from) {
                 (to.*section).*member = (from.*section).*member;
               },
               Codec<T>::parse(YAML::Node(YAML::NodeType::Null)).has_value()};
}

/// Every user-settable field of ConfigContainer, in the order of config.h.
const std::vector<Field>& fields();

/// "train" of "train.train_iters".
std::string_view section_of(std::string_view key);
/// "train_iters" of "train.train_iters".
std::string_view leaf_of(std::string_view key);
/// The field of a dotted key; nullptr when there is none.
const Field* find_field(std::string_view key);
/// Whether `path` names a section (or a level above some keys): "train", "model".
bool is_section(std::string_view path);
/// The sections, in the table's order.
std::vector<std::string> sections();
/// A field's value in `config` as to_yaml writes it.
std::string emit_value(const Field& f, const ConfigContainer& config);

}  // namespace bridge::training::detail
