// Argument checks that read as one line: require(condition, message) throws std::invalid_argument(message) when the
// condition fails. The message should name the field and say how to fix it.
#pragma once

#include <stdexcept>
#include <string>

namespace bridge::utils {

inline void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument(message);
}

}  // namespace bridge::utils
