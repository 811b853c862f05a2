// NumPy's .npy format for the cached GPT sample indices: written byte-identical to numpy.save (format 1.0), read
// with every header field checked. (The cache's file names and description are bridge's own, so Megatron's cached
// indices are not picked up, only written in the same format.) Cache files are written atomically, so ranks building
// the same cache at once are safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bridge::training::datasets {

/// Element types the index caches use, by NumPy descr.
enum class NpyType { kInt32, kUInt32, kInt64 };

/// A C-ordered array of integers, widened to int64 in memory.
struct NpyArray {
  NpyType type = NpyType::kInt64;
  std::vector<int64_t> shape;
  std::vector<int64_t> values;
};

/// Writes `values` (shape's product of them) as `type` to `path` like numpy.save, through a temporary file renamed
/// into place, so concurrent writers of identical content and concurrent readers are safe. Throws
/// std::invalid_argument when a value does not fit `type`, std::runtime_error on I/O failure.
void save_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
              const std::vector<int64_t>& values);

/// The bytes save_npy writes (numpy.save's, format 1.0); `path` only names the array in errors.
std::string npy_bytes(NpyType type, const std::vector<int64_t>& shape, const std::vector<int64_t>& values,
                      const std::string& path = "<array>");

/// Writes `bytes` to `path` through a temporary file unique to this host, process and call, renamed into place: a
/// reader sees the old file or the whole new one, and concurrent writers of identical content are harmless.
/// Throws std::runtime_error naming the file on failure.
void write_file_atomically(const std::string& path, std::string_view bytes);

/// Reads a .npy file of '<i4', '<u4' or '<i8' elements in C order. Throws std::runtime_error naming the file and what
/// is wrong (magic, header, dtype, Fortran order, size versus shape).
NpyArray load_npy(const std::string& path);

/// load_npy of bytes already in memory; `path` names them in errors.
NpyArray parse_npy(std::string_view bytes, const std::string& path = "<bytes>");

}  // namespace bridge::training::datasets
