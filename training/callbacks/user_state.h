// The persistent, typed key-value store that callbacks share (Megatron-Bridge's `user_state` dict).
//
// One store lives in each CallbackManager, is handed to every event as ctx.user_state, and is never reset. A key's
// type is fixed by its first store: reading or overwriting it as another type is an error that names the key and
// both types. Not thread-safe: callbacks fire on the training thread.
#pragma once

#include <any>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bridge::training {
inline namespace callbacks {

/// The type a value of type T is stored as: its decayed type, except that C strings become std::string, so that
/// set("name", "run") reads back as get<std::string>("name").
template <class T>
using user_state_value_t =
    std::conditional_t<std::is_same_v<std::decay_t<T>, const char*> || std::is_same_v<std::decay_t<T>, char*>,
                       std::string, std::decay_t<T>>;

class UserState {
 public:
  /// Stores `value` under `key`, replacing a value of the same type. Returns the stored value.
  ///
  /// Example: ctx.user_state.set("start_time", std::chrono::steady_clock::now());
  template <class T>
  user_state_value_t<T>& set(const std::string& key, T&& value) {
    using V = user_state_value_t<T>;
    auto it = values_.find(key);
    if (it == values_.end()) {
      it = values_.emplace(key, std::any(std::in_place_type<V>, std::forward<T>(value))).first;
      return *std::any_cast<V>(&it->second);
    }
    check_type(key, it->second, typeid(V));
    return *std::any_cast<V>(&it->second) = std::forward<T>(value);
  }

  /// The value under `key`. Throws std::out_of_range if absent and std::invalid_argument if it has another type.
  template <class T>
  T& get(std::string_view key) {
    std::any& slot = find_or_throw(key);
    check_type(key, slot, typeid(T));
    return *std::any_cast<T>(&slot);
  }
  template <class T>
  const T& get(std::string_view key) const {
    return const_cast<UserState*>(this)->get<T>(key);
  }

  /// The value under `key`, first storing `initial` if the key is absent (Python's dict.setdefault).
  ///
  /// Example: ++ctx.user_state.get_or_insert<int>("steps", 0);
  template <class T>
  T& get_or_insert(const std::string& key, T initial) {
    auto it = values_.find(key);
    if (it == values_.end())
      it = values_.emplace(key, std::any(std::in_place_type<T>, std::move(initial))).first;
    else
      check_type(key, it->second, typeid(T));
    return *std::any_cast<T>(&it->second);
  }

  /// The value under `key`, or `fallback` if the key is absent.
  template <class T>
  T get_or(std::string_view key, T fallback) const {
    auto it = values_.find(std::string(key));
    if (it == values_.end()) return fallback;
    check_type(key, it->second, typeid(T));
    return *std::any_cast<T>(&it->second);
  }

  bool contains(std::string_view key) const { return values_.count(std::string(key)) != 0; }
  /// Removes `key` (freeing it for a value of another type); returns whether it was present.
  bool erase(std::string_view key) { return values_.erase(std::string(key)) != 0; }
  std::size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }
  /// The keys, sorted.
  std::vector<std::string> keys() const;

  /// The value under `key` as stored, or null: for code that handles many types at once (checkpoints).
  const std::any* find_any(std::string_view key) const {
    auto it = values_.find(std::string(key));
    return it == values_.end() ? nullptr : &it->second;
  }
  /// Stores `value` under `key` whatever was there before (a checkpoint restoring the store).
  void set_any(const std::string& key, std::any value) { values_[key] = std::move(value); }

 private:
  std::any& find_or_throw(std::string_view key);
  static void check_type(std::string_view key, const std::any& slot, const std::type_info& requested);

  std::unordered_map<std::string, std::any> values_;
};

}  // namespace callbacks
}  // namespace bridge::training
