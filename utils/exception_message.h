// The words of an exception for a user: held by pointer, for code that catches everything (catch (...)) but must log
// or wrap the original's message rather than lose it; and without the C++ backtrace that LibTorch's c10::Error
// appends to what(), which buries the message under pages of frames. TORCH_SHOW_CPP_STACKTRACES=1 (PyTorch's own
// switch) keeps the backtrace, for debugging.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace bridge::utils {

/// Whether c10 errors keep their C++ backtrace in messages: TORCH_SHOW_CPP_STACKTRACES=1 in the environment.
inline bool show_cpp_stacktraces() {
  const char* value = std::getenv("TORCH_SHOW_CPP_STACKTRACES");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

/// what() of `error`, without c10's backtrace (unless TORCH_SHOW_CPP_STACKTRACES=1):
///   catch (const std::exception& e) { throw std::runtime_error("loading " + path + ": " + describe(e)); }
inline std::string describe(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error); c10_error && !show_cpp_stacktraces()) {
    return c10_error->what_without_backtrace();
  }
  return error.what();
}

/// describe() of the exception `error` holds, or a phrase saying it is not a std::exception:
///   catch (...) { logger().error("observer failed: {}", exception_message(std::current_exception())); }
inline std::string exception_message(const std::exception_ptr& error) {
  if (!error) return "no exception";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return describe(e);
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

}  // namespace bridge::utils
