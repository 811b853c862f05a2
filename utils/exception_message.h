// The words of an exception held by pointer, for code that catches everything (catch (...)) but must log or wrap the
// original's message rather than lose it.
#pragma once

#include <exception>
#include <string>

namespace bridge::utils {

/// what() of the exception `error` holds, or a phrase saying it is not a std::exception:
///   catch (...) { logger().error("observer failed: {}", exception_message(std::current_exception())); }
inline std::string exception_message(const std::exception_ptr& error) {
  if (!error) return "no exception";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

}  // namespace bridge::utils
