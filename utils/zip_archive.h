// Integrity of the zip archives PyTorch's files are (torch.save, LibTorch's PyTorchStreamWriter, bridge's
// checkpoints). LibTorch's reader never checks the CRC32 its writer puts on every entry, so a damaged checkpoint used
// to load without a word. Two checks, the stronger one where the file allows it:
//   - bridge's whole-file checksum: bridge ends each archive it writes with the comment "bridge-crc32=<8 hex digits>",
//     the CRC32 of every byte before the comment, so a flipped byte anywhere in the file is found;
//   - for archives without it (torch.save's, older bridge's): the zip directory is parsed strictly (every local
//     header matches its central entry, entries lie back to back from byte 0 to the central directory) and every
//     entry's CRC32 is checked, as `unzip -t` does.
//
//   ChecksummedZipSink sink(write);            // in PyTorchStreamWriter's writer function: sink.write(data, size)
//   ...; sink.finish();                         // after writeEndOfFile(): the comment goes last
//   verify_zip_archive(read_file(path));        // throws DamagedFileError saying what does not match
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace bridge::utils {

/// A file whose bytes are not the ones that were written: a checksum or the archive's structure does not match.
class DamagedFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One stored entry of a zip archive, as its central directory and local header describe it.
struct ZipEntry {
  std::string name;
  uint64_t local_header_offset = 0;
  uint64_t data_offset = 0;  ///< where the entry's bytes start
  uint64_t size = 0;         ///< stored, so compressed and uncompressed sizes are equal
  uint32_t crc32 = 0;
  uint64_t crc32_offset = 0;  ///< where the central directory keeps the CRC (the fuzzer rewrites it)
  uint64_t end_offset = 0;    ///< the byte after the entry's data and its data descriptor
};

/// The entries of `archive`, parsed strictly: throws DamagedFileError when the end of central directory, the zip64
/// records, the central directory or a local header is malformed, points outside the file, disagrees with another,
/// or leaves bytes between entries unaccounted for. Does not read the entries' data.
std::vector<ZipEntry> read_zip_directory(std::string_view archive);

/// How verify_zip_archive checked a file.
enum class ZipCheck : std::uint8_t {
  kWholeFile,  ///< bridge's whole-file CRC32 in the archive comment
  kEntries,    ///< the directory and every entry's CRC32 (no whole-file checksum present)
};

/// Checks `archive` (see the file comment). Throws DamagedFileError saying what does not match.
ZipCheck verify_zip_archive(std::string_view archive);

/// The CRC32 (zip's, zlib's polynomial) of `data`, continuing from `crc` (0 to start).
uint32_t crc32(std::string_view data, uint32_t crc = 0);

/// Passes the bytes of a zip archive on to `sink` unchanged, except that the archive's end (its end of central
/// directory record) gets bridge's whole-file checksum as its comment. The archive must have no comment of its own.
class ChecksummedZipSink {
 public:
  using Sink = std::function<void(const char* data, std::size_t size)>;
  explicit ChecksummedZipSink(Sink sink) : sink_(std::move(sink)) {}

  void write(const char* data, std::size_t size);
  /// Writes the held-back end of central directory and the comment. Throws std::logic_error when the bytes written
  /// did not end with an end of central directory record without a comment.
  void finish();

 private:
  void pass_on(const char* data, std::size_t size);

  Sink sink_;
  std::string tail_;  // the last bytes seen: the end of central directory record once the archive is complete
  uint32_t crc_ = 0;
};

}  // namespace bridge::utils
