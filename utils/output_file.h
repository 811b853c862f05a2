// A binary output file whose every failure (its directory, opening, writing, flushing) throws an error naming the
// file and a fix, so the metric writers do not each repeat that bookkeeping.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace bridge::utils {

/// An open file, written with write() and made visible to readers with flush(). Closed by the destructor.
class OutputFile {
 public:
  enum class Mode {
    kTruncate,  ///< start empty (a new file)
    kAppend,    ///< keep what an earlier run wrote and continue after it
  };

  /// Opens `path`, creating its missing parent directories. `owner` starts every error message
  /// ("TensorBoardWriter: ..."). Throws std::runtime_error naming the path when the directory or file cannot be made.
  OutputFile(std::string path, Mode mode, std::string owner);
  /// Closes the file; errors are ignored here, so call flush() first to see them.
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(std::string_view bytes);
  void flush();
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const std::string& what, int error) const;

  std::string path_;
  std::string owner_;
  std::FILE* file_ = nullptr;
};

}  // namespace bridge::utils
