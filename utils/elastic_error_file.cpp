// Writes torchelastic's error file (see the header): nlohmann-json escapes the message, whatever bytes it holds.
#include "utils/elastic_error_file.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>

namespace bridge::utils {

std::optional<std::filesystem::path> elastic_error_file_path() {
  const char* value = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::filesystem::path(value);
}

void write_elastic_error_file(const std::filesystem::path& path, const std::string& message,
                              const std::string& callstack, std::time_t timestamp) {
  nlohmann::json data;
  data["message"]["message"] = message;
  data["message"]["extraInfo"]["py_callstack"] = callstack;
  // A string of whole seconds: torchrun reads it with int(...), which refuses "1732812345.5".
  data["message"]["extraInfo"]["timestamp"] = std::to_string(static_cast<long long>(timestamp));
  // Invalid UTF-8 in a message (bytes of a file name) is replaced rather than failing the report.
  const std::string text = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);

  std::filesystem::path aside = path;
  aside += ".tmp";
  {
    std::ofstream out(aside, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      throw std::runtime_error("cannot write the torchelastic error file " + aside.string() + ": " +
                               std::strerror(errno) + "; check that TORCHELASTIC_ERROR_FILE's folder is writable");
    }
  }
  std::error_code error;
  std::filesystem::rename(aside, path, error);
  if (error) {
    std::filesystem::remove(aside, error);
    throw std::runtime_error("cannot move the torchelastic error file into place at " + path.string() + ": " +
                             error.message());
  }
}

bool record_elastic_error(const std::string& message, const std::string& callstack) noexcept {
  try {
    const std::optional<std::filesystem::path> path = elastic_error_file_path();
    if (!path) return false;
    write_elastic_error_file(*path, message, callstack);
    return true;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "warning: %s (torchrun will report this failure without its message)\n", error.what());
  } catch (...) {
    std::fprintf(stderr, "warning: the torchelastic error file could not be written\n");
  }
  return false;
}

}  // namespace bridge::utils
