// Small string helpers shared by error messages.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

namespace bridge::utils {

/// The items of `range` (strings, numbers, or types with a to_string overload found by ADL), separated by
/// `separator`.
///
/// Example: join(std::vector<std::string>{"a", "b"}, ", ") == "a, b"
template <class Range>
std::string join(const Range& range, std::string_view separator) {
  std::string result;
  bool first = true;
  for (const auto& item : range) {
    if (!first) result += separator;
    if constexpr (std::is_convertible_v<decltype(item), std::string_view>) {
      result += std::string_view(item);
    } else {
      using std::to_string;
      result += to_string(item);
    }
    first = false;
  }
  return result;
}

}  // namespace bridge::utils
