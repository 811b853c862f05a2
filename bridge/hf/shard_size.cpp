// Parses transformers' file sizes ("5GB", "2GiB") for bridge-export --max-shard-size.
#include "bridge/hf/shard_size.h"

#include <cctype>
#include <stdexcept>
#include <utility>

namespace bridge::hf {

int64_t parse_shard_size(const std::string& text) {
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  constexpr std::pair<const char*, int64_t> kUnits[] = {{"", 1},
                                                        {"B", 1},
                                                        {"KB", 1'000},
                                                        {"MB", 1'000'000},
                                                        {"GB", 1'000'000'000},
                                                        {"KIB", int64_t{1} << 10},
                                                        {"MIB", int64_t{1} << 20},
                                                        {"GIB", int64_t{1} << 30}};
  const std::string how = "'" + text +
                          "' is not a size: give a positive whole number of bytes or of KB, MB, GB, KiB, "
                          "MiB or GiB, as transformers' max_shard_size (\"5GB\")";
  if (digits == 0 || digits > 12) throw std::invalid_argument(how);
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const int64_t size = std::stoll(text.substr(0, digits)) * scale;
    if (size <= 0) throw std::invalid_argument(how);
    return size;
  }
  throw std::invalid_argument(how);
}

}  // namespace bridge::hf
