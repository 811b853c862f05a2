// UserState's error paths, kept out of the header's templates.
#include "training/user_state.h"

#include <algorithm>
#include <stdexcept>

#include "utils/type_name.h"

namespace bridge::training {

std::vector<std::string> UserState::keys() const {
  std::vector<std::string> result;
  result.reserve(values_.size());
  for (const auto& entry : values_) result.push_back(entry.first);
  std::sort(result.begin(), result.end());
  return result;
}

std::any& UserState::find_or_throw(std::string_view key) {
  auto it = values_.find(std::string(key));
  if (it == values_.end()) {
    throw std::out_of_range("user_state has no key '" + std::string(key) +
                            "'. Store it first with set(), or read it with get_or()/get_or_insert().");
  }
  return it->second;
}

void UserState::check_type(std::string_view key, const std::any& slot, const std::type_info& requested) {
  if (slot.type() == requested) return;
  throw std::invalid_argument("user_state['" + std::string(key) + "'] holds a value of type " +
                              utils::demangled_name(slot.type()) + ", not " + utils::demangled_name(requested) +
                              ". Read it as the type it was stored with, or erase() the key before storing another "
                              "type.");
}

}  // namespace bridge::training
