// Checks that an output path can be written before a long run depends on it: the directory is found or could be
// created, and a small probe file is created and removed there (so a read-only mount, missing permissions or a full
// disk show at once). Nothing the probe makes is left behind.
//
//   require_writable_directory(config.checkpoint.save, "checkpoint.save");  // throws naming the key and the fix
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace bridge::utils {

/// `path` when it exists, else its nearest existing ancestor: where creating it would start.
std::filesystem::path nearest_existing(const std::filesystem::path& path);

/// Throws std::invalid_argument naming `field` unless `directory` is a directory, or could be created, in which a
/// 4 KiB file can be written.
void require_writable_directory(const std::filesystem::path& directory, const std::string& field);

/// As require_writable_directory for the directory of `file`; an existing `file` must be a regular file that can be
/// opened for appending.
void require_writable_file(const std::filesystem::path& file, const std::string& field);

/// Bytes an unprivileged user may still write on the filesystem holding `path` (or its nearest existing ancestor).
uint64_t available_disk_bytes(const std::filesystem::path& path);

}  // namespace bridge::utils
