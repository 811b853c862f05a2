// C stdio behind utils/output_file.h: fwrite/fflush report failures through errno, which the messages quote.
#include "utils/output_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace bridge::utils {
namespace {

void create_directories_or_throw(const std::string& directory, const std::string& owner) {
  if (directory.empty()) return;
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error || !std::filesystem::is_directory(directory)) {
    const std::string reason = error ? error.message() : "a file of that name exists";
    throw std::runtime_error(owner + ": cannot create directory '" + directory + "' (" + reason +
                             "); point it at a writable location, or remove what is in the way");
  }
}

}  // namespace

OutputFile::OutputFile(std::string path, Mode mode, std::string owner)
    : path_(std::move(path)), owner_(std::move(owner)) {
  if (path_.empty()) throw std::invalid_argument(owner_ + ": the output path is empty; give a file path");
  create_directories_or_throw(std::filesystem::path(path_).parent_path().string(), owner_);
  file_ = std::fopen(path_.c_str(), mode == Mode::kAppend ? "ab" : "wb");
  if (file_ == nullptr) fail("cannot open", errno);
}

OutputFile::~OutputFile() {
  if (file_ != nullptr) std::fclose(file_);
}

void OutputFile::write(std::string_view bytes) {
  if (bytes.empty()) return;
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) fail("cannot write to", errno);
}

void OutputFile::flush() {
  if (std::fflush(file_) != 0) fail("cannot flush", errno);
}

void OutputFile::fail(const std::string& what, int error) const {
  throw std::runtime_error(owner_ + ": " + what + " '" + path_ + "' (" + std::strerror(error) +
                           "); check that the location is writable and the disk is not full");
}

}  // namespace bridge::utils
