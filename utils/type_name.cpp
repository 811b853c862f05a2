// Demangling through the Itanium ABI's __cxa_demangle, which GCC and Clang both provide.
#include "utils/type_name.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

namespace bridge::utils {

std::string demangled_name(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> name(abi::__cxa_demangle(type.name(), nullptr, nullptr, &status),
                                                   &std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(type.name());
}

std::string short_type_name(const std::type_info& type) {
  const std::string full = demangled_name(type);
  // The last "::" outside template brackets and parentheses ends the qualifier.
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < full.size(); ++i) {
    const char c = full[i];
    if (c == '<' || c == '(') ++depth;
    if (c == '>' || c == ')') --depth;
    if (depth == 0 && c == ':' && i + 1 < full.size() && full[i + 1] == ':') start = i + 2;
  }
  return full.substr(start);
}

}  // namespace bridge::utils
