// Converting callback state and user_state to checkpoint values and back.
#include "training/callbacks/callback_state.h"

#include <torch/torch.h>

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <tuple>
#include <typeindex>

#include "utils/logging.h"
#include "utils/strings.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

using GenericDict = c10::impl::GenericDict;
using GenericList = c10::impl::GenericList;

GenericDict string_dict() { return GenericDict(c10::AnyType::get(), c10::AnyType::get()); }

// ---- user_state: one codec per supported C++ type, named by the tag saved beside the value. ----

template <class T>
struct Scalar;
template <>
struct Scalar<bool> {
  static constexpr const char* kTag = "bool";
  static c10::IValue save(bool v) { return v; }
  static bool load(const c10::IValue& v) { return v.toBool(); }
};
template <>
struct Scalar<int> {
  static constexpr const char* kTag = "int";
  static c10::IValue save(int v) { return static_cast<int64_t>(v); }
  static int load(const c10::IValue& v) { return static_cast<int>(v.toInt()); }
};
template <>
struct Scalar<long> {
  static constexpr const char* kTag = "int64";
  static c10::IValue save(long v) { return static_cast<int64_t>(v); }
  static long load(const c10::IValue& v) { return static_cast<long>(v.toInt()); }
};
template <>
struct Scalar<long long> {
  static constexpr const char* kTag = "long long";
  static c10::IValue save(long long v) { return static_cast<int64_t>(v); }
  static long long load(const c10::IValue& v) { return static_cast<long long>(v.toInt()); }
};
template <>
struct Scalar<double> {
  static constexpr const char* kTag = "double";
  static c10::IValue save(double v) { return v; }
  static double load(const c10::IValue& v) { return v.toDouble(); }
};
template <>
struct Scalar<float> {
  static constexpr const char* kTag = "float";
  static c10::IValue save(float v) { return static_cast<double>(v); }
  static float load(const c10::IValue& v) { return static_cast<float>(v.toDouble()); }
};
template <>
struct Scalar<std::string> {
  static constexpr const char* kTag = "string";
  static c10::IValue save(const std::string& v) { return v; }
  static std::string load(const c10::IValue& v) { return v.toStringRef(); }
};
template <>
struct Scalar<torch::Tensor> {
  static constexpr const char* kTag = "tensor";
  static c10::IValue save(const torch::Tensor& v) { return v.detach().cpu().clone(); }
  // A 0-dim float64 tensor was stored as a float (see utils/torch_pickle.h): make it a tensor again.
  static torch::Tensor load(const c10::IValue& v) {
    return v.isDouble() ? torch::scalar_tensor(v.toDouble(), torch::kDouble) : v.toTensor();
  }
};

struct Codec {
  std::function<c10::IValue(const std::any&)> save;
  std::function<std::any(const c10::IValue&)> load;
};

template <class T>
void add_codecs(std::map<std::string, Codec>& by_tag, std::map<std::type_index, std::string>& tag_of) {
  using S = Scalar<T>;
  const std::string tag = S::kTag;
  by_tag[tag] = {[](const std::any& v) { return S::save(std::any_cast<const T&>(v)); },
                 [](const c10::IValue& v) { return std::any(S::load(v)); }};
  tag_of[typeid(T)] = tag;
  if constexpr (!std::is_same_v<T, bool>) {  // std::vector<bool> is no container of bools
    const std::string vector_tag = "vector<" + tag + ">";
    by_tag[vector_tag] = {[](const std::any& v) {
                            GenericList list(c10::AnyType::get());
                            for (const T& item : std::any_cast<const std::vector<T>&>(v)) list.push_back(S::save(item));
                            return c10::IValue(list);
                          },
                          [](const c10::IValue& v) {
                            std::vector<T> result;
                            for (const c10::IValue& item : v.toListRef()) result.push_back(S::load(item));
                            return std::any(std::move(result));
                          }};
    tag_of[typeid(std::vector<T>)] = vector_tag;
  }
  const std::string map_tag = "map<string, " + tag + ">";
  by_tag[map_tag] = {[](const std::any& v) {
                       GenericDict dict = string_dict();
                       for (const auto& [key, item] : std::any_cast<const std::map<std::string, T>&>(v)) {
                         dict.insert(key, S::save(item));
                       }
                       return c10::IValue(dict);
                     },
                     [](const c10::IValue& v) {
                       std::map<std::string, T> result;
                       for (const auto& item : v.toGenericDict())
                         result.emplace(item.key().toStringRef(), S::load(item.value()));
                       return std::any(std::move(result));
                     }};
  tag_of[typeid(std::map<std::string, T>)] = map_tag;
}

struct Codecs {
  std::map<std::string, Codec> by_tag;
  std::map<std::type_index, std::string> tag_of;
};

const Codecs& codecs() {
  static const Codecs table = [] {
    Codecs c;
    add_codecs<bool>(c.by_tag, c.tag_of);
    add_codecs<int>(c.by_tag, c.tag_of);
    add_codecs<long>(c.by_tag, c.tag_of);
    add_codecs<long long>(c.by_tag, c.tag_of);
    add_codecs<double>(c.by_tag, c.tag_of);
    add_codecs<float>(c.by_tag, c.tag_of);
    add_codecs<std::string>(c.by_tag, c.tag_of);
    add_codecs<torch::Tensor>(c.by_tag, c.tag_of);
    return c;
  }();
  return table;
}

template <class T, class Get>
c10::List<T> typed_list(c10::ArrayRef<c10::IValue> items, Get&& get) {
  c10::List<T> list;
  list.reserve(items.size());
  for (const c10::IValue& item : items) list.push_back(get(item));
  return list;
}

}  // namespace

c10::IValue to_plain_ivalue(const c10::IValue& value) {
  if (value.isList()) {
    GenericList list(c10::AnyType::get());
    for (const c10::IValue& item : value.toListRef()) list.push_back(to_plain_ivalue(item));
    return list;
  }
  if (value.isGenericDict()) {
    GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
    for (const auto& item : value.toGenericDict()) dict.insert(item.key(), to_plain_ivalue(item.value()));
    return dict;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& item : value.toTupleRef().elements()) items.push_back(to_plain_ivalue(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (value.isTensor()) return value.toTensor().detach().cpu().clone();
  return value;
}

c10::IValue to_typed_ivalue(const c10::IValue& value) {
  if (value.isList()) {
    const auto items = value.toListRef();
    auto all = [&](auto&& predicate) {
      for (const c10::IValue& item : items) {
        if (!predicate(item)) return false;
      }
      return !items.empty();
    };
    if (all([](const c10::IValue& v) { return v.isInt(); })) {
      return typed_list<int64_t>(items, [](const c10::IValue& v) { return v.toInt(); });
    }
    if (all([](const c10::IValue& v) { return v.isDouble(); })) {
      return typed_list<double>(items, [](const c10::IValue& v) { return v.toDouble(); });
    }
    if (all([](const c10::IValue& v) { return v.isBool(); })) {
      return typed_list<bool>(items, [](const c10::IValue& v) { return v.toBool(); });
    }
    if (all([](const c10::IValue& v) { return v.isString(); })) {
      return typed_list<std::string>(items, [](const c10::IValue& v) { return v.toStringRef(); });
    }
    if (all([](const c10::IValue& v) { return v.isTensor(); })) {
      return typed_list<at::Tensor>(items, [](const c10::IValue& v) { return v.toTensor(); });
    }
    GenericList list(c10::AnyType::get());
    for (const c10::IValue& item : items) list.push_back(to_typed_ivalue(item));
    return list;
  }
  if (value.isGenericDict()) {
    GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
    for (const auto& item : value.toGenericDict()) dict.insert(item.key(), to_typed_ivalue(item.value()));
    return dict;
  }
  return value;
}

c10::IValue save_callback_states(const CallbackManager& manager) {
  GenericDict states = string_dict();
  for (const std::shared_ptr<Callback>& callback : manager.stateful_callbacks()) {
    GenericDict state = string_dict();
    for (const auto& [key, value] : callback->state_dict()) state.insert(key, to_plain_ivalue(value));
    states.insert(callback->state_key(), state);
  }
  return states;
}

void load_callback_states(CallbackManager& manager, const c10::IValue& saved, const std::string& path) {
  if (!saved.isGenericDict()) throw std::runtime_error(path + ": 'callbacks' is not a dict; the file is damaged");
  const GenericDict states = saved.toGenericDict();
  std::vector<std::string> unknown;
  for (const auto& item : states) {
    const std::string& key = item.key().toStringRef();
    std::shared_ptr<Callback> target;
    for (const std::shared_ptr<Callback>& callback : manager.stateful_callbacks()) {
      if (callback->state_key() == key) target = callback;
    }
    if (!target) {
      unknown.push_back(key);
      continue;
    }
    StateDict state;
    for (const auto& entry : item.value().toGenericDict()) {
      state.emplace(entry.key().toStringRef(), to_typed_ivalue(entry.value()));
    }
    target->load_state_dict(state);
  }
  if (!unknown.empty()) {
    bridge::utils::logger().warn("the checkpoint {} holds state for callbacks this run does not have: {} (ignored)",
                                 path, bridge::utils::join(unknown, ", "));
  }
}

c10::IValue save_user_state(const UserState& state, std::vector<std::string>& skipped) {
  GenericDict saved = string_dict();
  for (const std::string& key : state.keys()) {
    const std::any* value = state.find_any(key);
    auto tag = codecs().tag_of.find(value->type());
    if (tag == codecs().tag_of.end()) {
      skipped.push_back(key);
      continue;
    }
    GenericDict entry = string_dict();
    entry.insert("type", tag->second);
    entry.insert("value", codecs().by_tag.at(tag->second).save(*value));
    saved.insert(key, entry);
  }
  return saved;
}

void load_user_state(UserState& state, const c10::IValue& saved, const std::string& path) {
  if (!saved.isGenericDict()) throw std::runtime_error(path + ": 'user_state' is not a dict; the file is damaged");
  for (const auto& item : saved.toGenericDict()) {
    const std::string& key = item.key().toStringRef();
    const GenericDict entry = item.value().toGenericDict();
    const std::string tag = entry.at(c10::IValue(std::string("type"))).toStringRef();
    auto codec = codecs().by_tag.find(tag);
    if (codec == codecs().by_tag.end()) {
      throw std::runtime_error(path + ": user_state '" + key + "' has the unknown type '" + tag +
                               "'; it was saved by a newer bridge");
    }
    state.set_any(key, codec->second.load(entry.at(c10::IValue(std::string("value")))));
  }
}

}  // namespace callbacks
}  // namespace bridge::training
