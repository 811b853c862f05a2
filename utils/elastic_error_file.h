// The error file torchrun reads back: a worker that fails writes its message to the path in TORCHELASTIC_ERROR_FILE
// (torchrun sets one per worker and attempt), so that torchrun's "Root Cause (first observed failure)" report shows
// that message instead of "<N/A>". The format is torchelastic's ErrorHandler.record_exception
// (torch/distributed/elastic/multiprocessing/errors/error_handler.py):
//
//   {"message": {"message": "<message>", "extraInfo": {"py_callstack": "<callstack>", "timestamp": "<seconds>"}}}
//
// torchrun prints py_callstack as the failure's "traceback" and takes the failure with the earliest timestamp
// (whole seconds, a string of an integer) as the root cause. C++ has no Python stack: callers pass what locates the
// failure instead (the exception's type, the rank, the step).
#pragma once

#include <ctime>
#include <filesystem>
#include <optional>
#include <string>

namespace bridge::utils {

/// The path in TORCHELASTIC_ERROR_FILE, or nullopt when it is unset or empty (not launched by torchrun).
std::optional<std::filesystem::path> elastic_error_file_path();

/// Writes the error file at `path` in torchelastic's format. Like torchelastic's record_exception, a file already
/// there is replaced (torchrun gives every attempt its own folder, so it is never an earlier attempt's error). The
/// file appears whole (written aside, then renamed). Throws std::runtime_error naming the path and the reason.
void write_elastic_error_file(const std::filesystem::path& path, const std::string& message,
                              const std::string& callstack, std::time_t timestamp = std::time(nullptr));

/// For an exit path: writes the error file when TORCHELASTIC_ERROR_FILE is set; a failure to write only prints a
/// warning on stderr (torchelastic warns too), so the exit status stays the failure's own. Returns whether it wrote.
bool record_elastic_error(const std::string& message, const std::string& callstack) noexcept;

}  // namespace bridge::utils
