// The write probe: a uniquely named file (host and process id, so ranks sharing a filesystem do not collide) made with
// O_EXCL, written, and unlinked.
#include "utils/write_probe.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace bridge::utils {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void fail(const std::string& field, const fs::path& path, const std::string& why) {
  throw std::invalid_argument(field + ": cannot write in " + path.string() + " (" + why +
                              "); choose a directory this " +
                              "user can write on a disk with space, or fix its permissions");
}

// Writes and removes a probe file in the existing directory `directory`.
void probe(const fs::path& directory, const std::string& field) {
  char host[256] = "host";
  ::gethostname(host, sizeof(host) - 1);
  const fs::path file = directory / (".bridge-write-probe." + std::string(host) + "." + std::to_string(::getpid()));
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) fail(field, directory, std::strerror(errno));
  const std::vector<char> block(4096, 0);
  const ssize_t written = ::write(fd, block.data(), block.size());
  const int write_error = written < 0 ? errno : 0;
  ::close(fd);
  ::unlink(file.c_str());
  if (written != static_cast<ssize_t>(block.size())) {
    fail(field, directory, write_error ? std::strerror(write_error) : "short write: the disk is full");
  }
}

}  // namespace

fs::path nearest_existing(const fs::path& path) {
  fs::path current = fs::absolute(path).lexically_normal();
  std::error_code error;
  while (!fs::exists(fs::symlink_status(current, error)) && current.has_relative_path()) {
    current = current.parent_path();
  }
  return current;
}

void require_writable_directory(const fs::path& directory, const std::string& field) {
  const fs::path existing = nearest_existing(directory);
  std::error_code error;
  if (!fs::is_directory(existing, error)) {
    throw std::invalid_argument(field + ": " + existing.string() + " is a file, not a directory, so " +
                                directory.string() + " cannot be made; choose another path");
  }
  probe(existing, field);
}

void require_writable_file(const fs::path& file, const std::string& field) {
  std::error_code error;
  if (fs::exists(fs::symlink_status(file, error))) {
    if (fs::is_directory(file, error)) {
      throw std::invalid_argument(field + ": " + file.string() + " is a directory; name a file (e.g. " +
                                  (file / "metrics.jsonl").string() + ")");
    }
    const int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) fail(field, file, std::strerror(errno));
    ::close(fd);
  }
  require_writable_directory(fs::absolute(file).parent_path(), field);
}

uint64_t available_disk_bytes(const fs::path& path) {
  struct statvfs stats {};
  const fs::path existing = nearest_existing(path);
  if (::statvfs(existing.c_str(), &stats) != 0) {
    throw std::runtime_error("statvfs(" + existing.string() + "): " + std::strerror(errno));
  }
  return static_cast<uint64_t>(stats.f_bavail) * stats.f_frsize;
}

}  // namespace bridge::utils
