// The codecs behind the config key table (config_table.h): one per C++ type of a config field, each reading a YAML
// node (nullopt when the node is not of the type), writing the value back, and naming the type for --help. Internal
// to the config files (config_table.cpp, config_yaml.cpp); users read values through config_yaml.h.
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "training/config/config.h"
#include "utils/strings.h"

namespace bridge::training::detail {

using bridge::utils::to_lower;
using bridge::utils::trim;
using std::chrono::milliseconds;

// A codec's parse may also throw std::invalid_argument for a value it knows and refuses, with the reason (the caller
// prefixes the key and where it was written).

// A plain (unquoted) YAML null: `key:`, `key: null`, `key: ~`. A quoted "null" is the string.
inline bool is_null(const YAML::Node& node) { return !node.IsDefined() || node.IsNull(); }

template <class Number>
std::optional<Number> parse_number(const YAML::Node& node) {
  if (!node.IsScalar()) return std::nullopt;
  std::string_view text = trim(node.Scalar());
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  Number value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

template <class T>
struct Codec;

template <>
struct Codec<int64_t> {
  static std::string type() { return "int"; }
  static std::optional<int64_t> parse(const YAML::Node& node) { return parse_number<int64_t>(node); }
  static void emit(YAML::Emitter& out, int64_t value) { out << std::to_string(value); }
};

template <>
struct Codec<int> {
  static std::string type() { return "int"; }
  static std::optional<int> parse(const YAML::Node& node) { return parse_number<int>(node); }
  static void emit(YAML::Emitter& out, int value) { out << std::to_string(value); }
};

template <>
struct Codec<uint64_t> {
  static std::string type() { return "unsigned int"; }
  static std::optional<uint64_t> parse(const YAML::Node& node) { return parse_number<uint64_t>(node); }
  static void emit(YAML::Emitter& out, uint64_t value) { out << std::to_string(value); }
};

template <>
struct Codec<double> {
  static std::string type() { return "float"; }
  static std::optional<double> parse(const YAML::Node& node) { return parse_number<double>(node); }
  static void emit(YAML::Emitter& out, double value) {
    char text[32];
    // The shortest text that reads back as the same double, so to_yaml round-trips exactly.
    const auto result = std::to_chars(text, text + sizeof(text), value);
    out << std::string(text, result.ptr);
  }
};

template <>
struct Codec<bool> {
  static std::string type() { return "bool"; }
  static std::optional<bool> parse(const YAML::Node& node) {
    if (!node.IsScalar()) return std::nullopt;
    const std::string text = to_lower(trim(node.Scalar()));
    if (text == "true" || text == "yes" || text == "on") return true;
    if (text == "false" || text == "no" || text == "off") return false;
    return std::nullopt;
  }
  static void emit(YAML::Emitter& out, bool value) { out << (value ? "true" : "false"); }
};

template <>
struct Codec<std::string> {
  static std::string type() { return "string"; }
  static std::optional<std::string> parse(const YAML::Node& node) {
    if (is_null(node)) return std::string();  // `save:` or `save: null` clears the field
    if (!node.IsScalar()) return std::nullopt;
    return node.Scalar();
  }
  static void emit(YAML::Emitter& out, const std::string& value) { out << value; }
};

template <class T>
struct Codec<std::vector<T>> {
  static std::string type() { return "list of " + Codec<T>::type() + "s"; }
  static std::optional<std::vector<T>> parse(const YAML::Node& node) {
    if (is_null(node)) return std::vector<T>();
    if (node.IsScalar()) {  // one item needs no brackets
      std::optional<T> item = Codec<T>::parse(node);
      if (!item) return std::nullopt;
      return std::vector<T>{std::move(*item)};
    }
    if (!node.IsSequence()) return std::nullopt;
    std::vector<T> items;
    for (const YAML::Node& node_item : node) {
      if (!node_item.IsScalar()) return std::nullopt;
      std::optional<T> item = Codec<T>::parse(node_item);
      if (!item) return std::nullopt;
      items.push_back(std::move(*item));
    }
    return items;
  }
  static void emit(YAML::Emitter& out, const std::vector<T>& value) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const T& item : value) Codec<T>::emit(out, item);
    out << YAML::EndSeq;
  }
};

template <class T>
struct Codec<std::optional<T>> {
  static std::string type() { return Codec<T>::type() + " or null"; }
  static std::optional<std::optional<T>> parse(const YAML::Node& node) {
    if (is_null(node)) return std::optional<T>();
    std::optional<T> value = Codec<T>::parse(node);
    if (!value) return std::nullopt;
    return value;
  }
  static void emit(YAML::Emitter& out, const std::optional<T>& value) {
    if (value) {
      Codec<T>::emit(out, *value);
    } else {
      out << YAML::Null;
    }
  }
};

struct DurationUnit {
  std::string_view name;
  int64_t milliseconds;
};
// Largest first: emit() picks the largest unit that divides the value.
inline constexpr DurationUnit kDurationUnits[] = {{"h", 3'600'000}, {"min", 60'000}, {"s", 1'000}, {"ms", 1}};

template <>
struct Codec<milliseconds> {
  static std::string type() { return "duration"; }
  static std::optional<milliseconds> parse(const YAML::Node& node) {
    if (!node.IsScalar()) return std::nullopt;
    const std::string_view text = trim(node.Scalar());
    const std::size_t split = text.find_first_not_of("0123456789.");
    if (split == 0 || split == std::string_view::npos) return std::nullopt;  // a bare number has no unit
    double amount = 0.0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + split, amount);
    if (error != std::errc() || end != text.data() + split) return std::nullopt;
    const std::string unit = to_lower(trim(text.substr(split)));
    for (const DurationUnit& candidate : kDurationUnits) {
      if (unit != candidate.name && !(unit == "m" && candidate.name == "min")) continue;
      const double ms = amount * static_cast<double>(candidate.milliseconds);
      if (ms != static_cast<double>(static_cast<int64_t>(ms))) return std::nullopt;  // below a millisecond
      return milliseconds(static_cast<int64_t>(ms));
    }
    return std::nullopt;
  }
  static void emit(YAML::Emitter& out, milliseconds value) {
    for (const DurationUnit& unit : kDurationUnits) {
      if (value.count() % unit.milliseconds == 0) {
        out << std::to_string(value.count() / unit.milliseconds) + std::string(unit.name);
        return;
      }
    }
  }
};

inline constexpr parallel::Backend kBackends[] = {parallel::Backend::kGloo, parallel::Backend::kNccl};

template <>
struct Codec<parallel::Backend> {
  static std::string type() {
    std::vector<std::string_view> names;
    for (parallel::Backend backend : kBackends) names.push_back(parallel::to_string(backend));
    return utils::join(names, " or ");
  }
  static std::optional<parallel::Backend> parse(const YAML::Node& node) {
    if (!node.IsScalar()) return std::nullopt;
    const std::string text = to_lower(trim(node.Scalar()));
    for (parallel::Backend backend : kBackends) {
      if (text == parallel::to_string(backend)) return backend;
    }
    return std::nullopt;
  }
  static void emit(YAML::Emitter& out, parallel::Backend value) { out << std::string(parallel::to_string(value)); }
};

// An enumeration read by name from a table of {value, name} pairs, case-insensitively; the first name of a value is
// the one written. Megatron-Bridge's YAML dumps write a function as {_target_: torch.nn.functional.gelu, _call_:
// false}: the last name of its _target_ is read.
template <class E, const auto& kNames>
struct NamedEnumCodec {
  static std::string type() {
    std::vector<std::string_view> names;
    for (const auto& [value, name] : kNames) {
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
    std::string text;
    for (std::size_t i = 0; i < names.size(); ++i) {
      text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + std::string(names[i]);
    }
    return text;
  }
  static std::optional<E> parse(const YAML::Node& node) {
    std::string text;
    if (node.IsMap() && node["_target_"] && node["_target_"].IsScalar()) {
      text = node["_target_"].Scalar();
      text = text.substr(text.rfind('.') + 1);
    } else if (node.IsScalar()) {
      text = trim(node.Scalar());
    } else {
      return std::nullopt;
    }
    text = to_lower(text);
    for (const auto& [value, name] : kNames) {
      if (text == to_lower(name)) return value;
    }
    return std::nullopt;
  }
  static void emit(YAML::Emitter& out, E value) {
    for (const auto& [candidate, name] : kNames) {
      if (value == candidate) {
        out << std::string(name);
        return;
      }
    }
  }
};

// Megatron-Core's names of the model's options (bridge/models/gpt_config.h holds the tables).
template <>
struct Codec<models::AttnBackend> : NamedEnumCodec<models::AttnBackend, models::kAttnBackendNames> {};
template <>
struct Codec<models::ActivationFunc> : NamedEnumCodec<models::ActivationFunc, models::kActivationFuncNames> {};
template <>
struct Codec<models::Normalization> : NamedEnumCodec<models::Normalization, models::kNormalizationNames> {};
template <>
struct Codec<models::PositionEmbeddingType>
    : NamedEnumCodec<models::PositionEmbeddingType, models::kPositionEmbeddingTypeNames> {};
template <>
struct Codec<models::RecomputeGranularity>
    : NamedEnumCodec<models::RecomputeGranularity, models::kRecomputeGranularityNames> {};
template <>
struct Codec<models::RecomputeMethod> : NamedEnumCodec<models::RecomputeMethod, models::kRecomputeMethodNames> {};
template <>
struct Codec<models::MoERouterScoreFunction>
    : NamedEnumCodec<models::MoERouterScoreFunction, models::kMoERouterScoreFunctionNames> {};
template <>
struct Codec<models::MoELoadBalancingType>
    : NamedEnumCodec<models::MoELoadBalancingType, models::kMoELoadBalancingTypeNames> {};
template <>
struct Codec<models::MoETokenDispatcherType>
    : NamedEnumCodec<models::MoETokenDispatcherType, models::kMoETokenDispatcherTypeNames> {};
template <>
struct Codec<models::MoETokenDropPolicy>
    : NamedEnumCodec<models::MoETokenDropPolicy, models::kMoETokenDropPolicyNames> {};
template <>
struct Codec<models::MoERouterDtype> : NamedEnumCodec<models::MoERouterDtype, models::kMoERouterDtypeNames> {};

// Megatron-Core's cp_comm_type. Its hierarchical "a2a+p2p" (a2a inside hierarchical_context_parallel_sizes' inner
// groups, p2p across them) is refused by name rather than as an unknown value.
template <>
struct Codec<parallel::context_parallel::CpCommType>
    : NamedEnumCodec<parallel::context_parallel::CpCommType, parallel::context_parallel::kCpCommTypeNames> {
  static std::optional<parallel::context_parallel::CpCommType> parse(const YAML::Node& node) {
    if (node.IsScalar() && to_lower(trim(node.Scalar())) == "a2a+p2p") {
      throw std::invalid_argument(
          "a2a+p2p (Megatron-Core's hierarchical context parallelism, with hierarchical_context_parallel_sizes) is "
          "not supported; use a2a (the heads per tensor-parallel rank divisible by context_parallel_size) or p2p");
    }
    return NamedEnumCodec::parse(node);
  }
};

// Megatron-Core's moe_layer_freq: an int (every N-th layer) or a list of 0/1, one per layer.
template <>
struct Codec<models::MoELayerFreq> {
  static std::string type() { return "int or list of 0/1"; }
  static std::optional<models::MoELayerFreq> parse(const YAML::Node& node) {
    models::MoELayerFreq freq;
    if (node.IsScalar()) {
      std::optional<int64_t> every = Codec<int64_t>::parse(node);
      if (!every) return std::nullopt;
      freq.every = *every;
      return freq;
    }
    std::optional<std::vector<int64_t>> pattern = Codec<std::vector<int64_t>>::parse(node);
    if (!pattern || pattern->empty()) return std::nullopt;
    freq.pattern = std::move(*pattern);
    return freq;
  }
  static void emit(YAML::Emitter& out, const models::MoELayerFreq& value) {
    if (value.pattern.empty()) {
      Codec<int64_t>::emit(out, value.every);
    } else {
      Codec<std::vector<int64_t>>::emit(out, value.pattern);
    }
  }
};

// Options keep the YAML text they were written as: a scalar as it reads, anything else in flow style.
inline std::string yaml_text(const YAML::Node& node) {
  // A quoted scalar ("null", "3", "a: b") stays quoted, so that reading the text again gives the same string.
  if (node.IsScalar() && node.Tag() == "!") {
    YAML::Emitter out;
    out << YAML::DoubleQuoted << node.Scalar();
    return out.c_str();
  }
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  out << YAML::Flow << node;
  return out.c_str();
}

}  // namespace bridge::training::detail
