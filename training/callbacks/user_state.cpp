// UserState's error paths, kept out of the header's templates.
#include "training/callbacks/user_state.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>

#include "utils/type_name.h"

namespace bridge::training {
inline namespace callbacks {

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

namespace {

// How C++ code spells the arithmetic types (int64_t is long on the platforms bridge builds for); nullptr for others.
const char* arithmetic_spelling(const std::type_info& type) {
  static const std::pair<const std::type_info*, const char*> kTypes[] = {{&typeid(int), "int"},
                                                                         {&typeid(std::int64_t), "int64_t"},
                                                                         {&typeid(long long), "long long"},
                                                                         {&typeid(unsigned), "unsigned"},
                                                                         {&typeid(std::uint64_t), "uint64_t"},
                                                                         {&typeid(short), "short"},
                                                                         {&typeid(float), "float"},
                                                                         {&typeid(double), "double"},
                                                                         {&typeid(std::int8_t), "int8_t"},
                                                                         {&typeid(std::uint8_t), "uint8_t"},
                                                                         {&typeid(bool), "bool"}};
  for (const auto& [info, spelling] : kTypes) {
    if (*info == type) return spelling;
  }
  return nullptr;
}

}  // namespace

void UserState::check_type(std::string_view key, const std::any& slot, const std::type_info& requested) {
  if (slot.type() == requested) return;
  const std::string quoted = "'" + std::string(key) + "'";
  const char* stored = arithmetic_spelling(slot.type());
  const char* wanted = arithmetic_spelling(requested);
  if (stored != nullptr && wanted != nullptr) {
    // set("n", 1) stores an int; get<int64_t>("n") is the usual slip.
    const std::string name = "\"" + std::string(key) + "\"";
    throw std::invalid_argument("user_state[" + quoted + "] holds a value of type " + stored + ", not " + wanted +
                                ": a number keeps the exact type it was stored with (a literal 1 is an int, 1.0 a "
                                "double). Read it as get<" +
                                stored + ">(" + name + "), or store the type you read: set(" + name + ", " + wanted +
                                "{...}).");
  }
  throw std::invalid_argument("user_state[" + quoted + "] holds a value of type " +
                              bridge::utils::demangled_name(slot.type()) + ", not " +
                              bridge::utils::demangled_name(requested) +
                              ". Read it as the type it was stored with, or erase() the key before storing another "
                              "type.");
}

}  // namespace callbacks
}  // namespace bridge::training
