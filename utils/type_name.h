// Readable C++ type names for error messages and default callback names.
#pragma once

#include <string>
#include <typeinfo>

namespace bridge::utils {

/// The demangled name of `type`, e.g. "std::vector<int, std::allocator<int> >".
std::string demangled_name(const std::type_info& type);

/// The demangled name without its namespaces and enclosing classes, e.g. "LossLogger" for
/// "my::(anonymous namespace)::LossLogger". Template arguments are kept as they are.
std::string short_type_name(const std::type_info& type);

}  // namespace bridge::utils
