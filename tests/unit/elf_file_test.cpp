// utils::check_shared_object against real files: a shared library this test links (libc) passes whole, and every
// truncation of a copy of it, a non-ELF file and an executable are refused with the reason.
#include "utils/elf_file.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <link.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// The path of the loaded library that defines `symbol` (a real, whole shared object on this machine).
std::string library_of(const void* symbol) {
  Dl_info info{};
  EXPECT_NE(::dladdr(symbol, &info), 0);
  return fs::canonical(info.dli_fname).string();
}

std::string message_of(const std::string& path) {
  try {
    bridge::utils::check_shared_object(path);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

class ElfFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("elf_file_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string copy_truncated(const std::string& from, std::uintmax_t size) {
    const fs::path to = dir_ / "lib.so";
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
    fs::resize_file(to, size);
    return to.string();
  }
  fs::path dir_;
};

TEST_F(ElfFile, AWholeSharedLibraryPasses) {
  EXPECT_EQ(message_of(library_of(reinterpret_cast<const void*>(&::printf))), "");
}

TEST_F(ElfFile, EveryTruncationIsRefusedNamingTheFile) {
  const std::string libc = library_of(reinterpret_cast<const void*>(&::printf));
  const std::uintmax_t size = fs::file_size(libc);
  for (const std::uintmax_t cut : {std::uintmax_t{0}, std::uintmax_t{3}, std::uintmax_t{40}, std::uintmax_t{100},
                                   std::uintmax_t{4096}, size / 2, size - 4096, size - 1}) {
    const std::string copy = copy_truncated(libc, cut);
    const std::string message = message_of(copy);
    EXPECT_THAT(message, HasSubstr("'" + copy + "' is not a loadable shared library: it is truncated")) << cut;
    EXPECT_THAT(message, HasSubstr("the file has " + std::to_string(cut) + " bytes")) << cut;
  }
}

TEST_F(ElfFile, NonElfFilesAndExecutablesAreRefusedWithTheReason) {
  const fs::path text = dir_ / "notes.so";
  std::ofstream(text) << std::string(200, 'x');
  EXPECT_THAT(message_of(text.string()), HasSubstr("it is not an ELF file"));
  EXPECT_THAT(message_of((dir_ / "missing.so").string()), HasSubstr("cannot be opened"));
  // A non-PIE executable is ET_EXEC; a PIE one is ET_DYN and passes this check (dlopen then refuses it by itself).
  const std::string self = fs::canonical("/proc/self/exe").string();
  const std::string message = message_of(self);
  EXPECT_TRUE(message.empty() || message.find("not a shared library (ET_DYN)") != std::string::npos) << message;
}

}  // namespace
