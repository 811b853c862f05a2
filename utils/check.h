// Argument checks that read as one line: require(condition, message) throws std::invalid_argument(message) when the
// condition fails, and checked_product multiplies sizes that come from a config without overflowing. The message
// should name the field and say how to fix it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

namespace bridge::utils {

inline void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument(message);
}

/// The product of config sizes, or std::invalid_argument naming every factor when it leaves int64 (a size that large
/// would overflow inside the run with a message that names no key):
///   checked_product({{"train.train_iters", iters}, {"train.global_batch_size", batch}}, "the samples consumed")
inline int64_t checked_product(std::initializer_list<std::pair<const char*, int64_t>> factors,
                               const std::string& what) {
  int64_t product = 1;
  bool overflow = false;
  for (const auto& [name, value] : factors) overflow = overflow || __builtin_mul_overflow(product, value, &product);
  if (!overflow) return product;
  std::string names;
  for (const auto& [name, value] : factors) {
    names += (names.empty() ? "" : " x ") + std::string(name) + " (" + std::to_string(value) + ")";
  }
  throw std::invalid_argument(names + " overflows a 64-bit integer (" + what + "); lower one of them");
}

}  // namespace bridge::utils
