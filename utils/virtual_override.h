// Tells whether an object's dynamic type overrides a virtual member function of a base class.
//
// CallbackManager::add registers a callback only for the events its class overrides, also when the object is held
// through a base pointer. Standard C++ cannot compare virtual functions at run time, so this reads the vtable as the
// Itanium C++ ABI (GCC and Clang on every platform LibTorch supports) lays it out. Elsewhere it answers "overridden",
// which is always safe: the base no-op is then simply called.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

namespace bridge::utils {
namespace detail {

// Itanium ABI 2.3: a pointer to member function is {ptr, adj}. For a virtual function, ptr holds 1 + the byte offset
// of its vtable slot; on ARM, MIPS and WebAssembly, adj's lowest bit marks "virtual" and ptr holds the offset.
struct MemberFunctionPointer {
  std::uintptr_t ptr;
  std::ptrdiff_t adj;
};

template <class Fn>
std::optional<std::size_t> vtable_slot(Fn fn) {
  static_assert(sizeof(Fn) == sizeof(MemberFunctionPointer), "unexpected pointer-to-member-function layout");
  MemberFunctionPointer rep{};
  std::memcpy(&rep, &fn, sizeof(rep));
#if defined(__arm__) || defined(__aarch64__) || defined(__mips__) || defined(__wasm__)
  if ((rep.adj & 1) == 0) return std::nullopt;
  return rep.ptr / sizeof(void*);
#else
  if ((rep.ptr & 1) == 0) return std::nullopt;
  return (rep.ptr - 1) / sizeof(void*);
#endif
}

inline const void* vtable_entry(const void* object, std::size_t slot) {
  const void* const* vtable = nullptr;
  std::memcpy(&vtable, object, sizeof(vtable));  // the vptr opens every polymorphic (sub)object
  return vtable[slot];
}

}  // namespace detail

/// True if `object`'s dynamic type overrides `method`, a virtual member function of Base; `reference` is an object
/// whose dynamic type is exactly Base.
///
/// Example: overrides(*callback, Callback{}, &Callback::on_train_start)
template <class Base, class R, class... Args>
bool overrides(const Base& object, const Base& reference, R (Base::*method)(Args...)) {
#if defined(__GXX_ABI_VERSION)
  const std::optional<std::size_t> slot = detail::vtable_slot(method);
  if (!slot) return true;  // not recognised as virtual: say "overridden", the safe answer
  return detail::vtable_entry(&object, *slot) != detail::vtable_entry(&reference, *slot);
#else
  (void)object, (void)reference, (void)method;
  return true;
#endif
}

/// As above, for a const member function.
template <class Base, class R, class... Args>
bool overrides(const Base& object, const Base& reference, R (Base::*method)(Args...) const) {
#if defined(__GXX_ABI_VERSION)
  const std::optional<std::size_t> slot = detail::vtable_slot(method);
  if (!slot) return true;
  return detail::vtable_entry(&object, *slot) != detail::vtable_entry(&reference, *slot);
#else
  (void)object, (void)reference, (void)method;
  return true;
#endif
}

}  // namespace bridge::utils
