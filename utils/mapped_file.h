// A read-only memory mapping of a whole file, for data read far more often than it is opened (indexed datasets).
//
// A mapped file that shrinks while mapped (rewritten, truncated, or its disk failing) makes the next read of the
// missing pages raise SIGBUS, which by default kills the process with no word of which file it was. Every live
// MappedFile is recorded, and a SIGBUS handler installed with the first one prints the file's name, the offset and
// the likely cause to stderr before the signal takes its normal course (the previous handler, or the default exit).
//
//   utils::MappedFile bin("/data/corpus_text_document.bin");
//   const unsigned char* bytes = bin.data();  // bin.size() bytes; null for an empty file
#pragma once

#include <cstddef>
#include <string>

namespace bridge::utils {

class MappedFile {
 public:
  /// Maps `path` read-only. Throws std::runtime_error "cannot open|stat|memory-map <path>: <reason>".
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  /// The first byte, or null when the file is empty.
  const unsigned char* data() const { return data_; }
  /// Bytes mapped: the file's size when it was opened.
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
  int slot_ = -1;  ///< where the SIGBUS handler finds this mapping; -1 = not recorded (too many live mappings)
};

}  // namespace bridge::utils
