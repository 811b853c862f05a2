// POSIX open/write/fsync/rename behind utils/durable_file.h: the C++ streams cannot fsync.
#include "utils/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace bridge::utils {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void fail(const std::string& what, const fs::path& path, int error) {
  throw std::runtime_error(what + " '" + path.string() + "' failed (" + std::strerror(error) +
                           "); check that the location is writable and the disk is not full");
}

// Closes on scope exit; close errors after a successful fsync carry no information.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

void fsync_directory(const fs::path& directory) {
  const fs::path target = directory.empty() ? fs::path(".") : directory;
  Descriptor fd(::open(target.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) fail("opening directory", target, errno);
  if (::fsync(fd.get()) != 0) fail("fsync of directory", target, errno);
}

void write_file_durably(const fs::path& path, std::string_view bytes) {
  write_file_durably(path, [&](const WriteBytes& write) { write(bytes.data(), bytes.size()); });
}

void write_file_durably(const fs::path& path, const std::function<void(const WriteBytes& write)>& produce) {
  const fs::path parent = path.parent_path();
  if (!parent.empty()) {
    std::error_code error;
    fs::create_directories(parent, error);
    if (error) fail("creating directory", parent, error.value());
  }
  const fs::path temporary = path.string() + ".tmp";
  try {
    {
      Descriptor fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (fd.get() < 0) fail("creating", temporary, errno);
      produce([&](const char* data, std::size_t left) {
        while (left > 0) {
          const ssize_t written = ::write(fd.get(), data, left);
          if (written < 0) {
            if (errno == EINTR) continue;
            fail("writing", temporary, errno);
          }
          data += written;
          left -= static_cast<std::size_t>(written);
        }
      });
      if (::fsync(fd.get()) != 0) fail("fsync of", temporary, errno);
    }
    if (::rename(temporary.c_str(), path.c_str()) != 0) fail("renaming to", path, errno);
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  fsync_directory(parent);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open '" + path.string() + "' for reading (" + std::strerror(errno) + ")");
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) throw std::runtime_error("reading '" + path.string() + "' failed");
  return content.str();
}

}  // namespace bridge::utils
