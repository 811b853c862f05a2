// Files that survive a crash at any moment: written under a temporary name, fsynced, renamed over the final name,
// and the directory fsynced, so a reader (or the next run after SIGKILL or a power loss) sees either the old file or
// the whole new one, never a torn one. Checkpoints and their tracker file are written this way.
//
//   write_file_durably("ckpt/latest_checkpointed_iteration.txt", "10\n");
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace bridge::utils {

/// Writes `bytes` to `path` atomically and durably: `path`.tmp, fsync, rename, fsync of the parent directory.
/// Creates missing parent directories. Throws std::runtime_error naming the path and the system's reason; on
/// failure the temporary file is removed and `path` keeps its old content.
void write_file_durably(const std::filesystem::path& path, std::string_view bytes);

/// As above, for content produced in pieces: `produce` calls `write(data, size)` as often as it likes.
using WriteBytes = std::function<void(const char* data, std::size_t size)>;
void write_file_durably(const std::filesystem::path& path, const std::function<void(const WriteBytes& write)>& produce);

/// fsyncs a directory, so that the entries created, renamed or removed in it are on disk. Throws on failure.
void fsync_directory(const std::filesystem::path& directory);

/// Reads a whole file; throws std::runtime_error naming the path when it cannot.
std::string read_file(const std::filesystem::path& path);

}  // namespace bridge::utils
