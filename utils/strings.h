// Small string helpers shared by error messages and progress output.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
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

/// `text` without the spaces, tabs and line breaks around it: trim("  a b\n") == "a b".
inline std::string_view trim(std::string_view text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

/// `text` with its ASCII letters in lowercase: to_lower("Fp16-Mixed") == "fp16-mixed".
inline std::string to_lower(std::string_view text) {
  std::string result(text);
  std::transform(result.begin(), result.end(), result.begin(), [](unsigned char c) { return std::tolower(c); });
  return result;
}

/// Seconds as "H:MM:SS", rounded to the second, hours unbounded: format_duration(3723.4) == "1:02:03". Negative or
/// non-finite (or absurd) values read "?:??:??".
inline std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0.0 || seconds > 1e12) return "?:??:??";
  const auto total = static_cast<std::int64_t>(std::llround(seconds));
  char text[32];
  std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld", static_cast<long long>(total / 3600),
                static_cast<long long>(total / 60 % 60), static_cast<long long>(total % 60));
  return text;
}

}  // namespace bridge::utils
