// zip_archive: bridge's whole-file checksum finds a flipped byte at every offset of a file it wrote; archives without
// it (torch.save's) have their directory and every entry's CRC32 checked; the checksumming sink writes the same
// archive however its writer splits the bytes; load_torch_pickle refuses a damaged file naming it.
#include "utils/zip_archive.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "utils/durable_file.h"
#include "utils/torch_pickle.h"

namespace bridge::utils {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("bridge_zip_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

// A small checkpoint-like file as bridge writes it: tensors, a nested dict, strings, a float.
std::string bridge_archive() {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("weight", torch::arange(12, torch::kFloat32).reshape({3, 4}));
  state.insert("step", static_cast<int64_t>(7));
  state.insert("lr", 0.25);
  state.insert("name", std::string("tiny"));
  const fs::path path = scratch("bridge.pt");
  save_torch_pickle(path, state);
  return read_file(path);
}

// The same archive without bridge's comment: what torch.save writes (PyTorch puts no comment on its archives).
std::string without_comment(std::string archive) {
  const std::size_t comment = archive.size() - archive.rfind("bridge-crc32=");
  archive.resize(archive.size() - comment);
  archive[archive.size() - 2] = 0;  // the end record's comment length
  archive[archive.size() - 1] = 0;
  return archive;
}

TEST(ZipArchive, Crc32MatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32("123456789"), 0xCBF43926U);
  EXPECT_EQ(crc32("6789", crc32("12345")), 0xCBF43926U);
}

TEST(ZipArchive, BridgeArchivesCarryAWholeFileChecksum) {
  const std::string archive = bridge_archive();
  EXPECT_EQ(archive.substr(archive.size() - 21, 13), "bridge-crc32=");
  EXPECT_EQ(verify_zip_archive(archive), ZipCheck::kWholeFile);
  // The directory parses strictly too, and entries lie back to back from byte 0.
  const std::vector<ZipEntry> entries = read_zip_directory(archive);
  ASSERT_FALSE(entries.empty());
  EXPECT_EQ(entries.front().local_header_offset, 0U);
}

// The property the issue asks for: one flipped byte anywhere in a file bridge wrote is found.
TEST(ZipArchive, AFlippedByteAtEveryOffsetIsFound) {
  const std::string archive = bridge_archive();
  for (std::size_t offset = 0; offset < archive.size(); ++offset) {
    for (const unsigned char mask : {0x01, 0x80}) {
      std::string damaged = archive;
      damaged[offset] = static_cast<char>(damaged[offset] ^ mask);
      EXPECT_THROW(verify_zip_archive(damaged), DamagedFileError) << "offset " << offset << " mask " << int{mask};
    }
  }
}

TEST(ZipArchive, TruncatedAndExtendedFilesAreFound) {
  const std::string archive = bridge_archive();
  for (const std::size_t size : {std::size_t{0}, std::size_t{21}, archive.size() / 2, archive.size() - 1}) {
    EXPECT_THROW(verify_zip_archive(archive.substr(0, size)), DamagedFileError) << size;
  }
  EXPECT_THROW(verify_zip_archive(archive + "x"), DamagedFileError);
  EXPECT_THROW(verify_zip_archive(archive + archive), DamagedFileError);
}

// Without the comment, every entry's CRC32 and the directory's consistency are what is checked.
TEST(ZipArchive, ArchivesWithoutTheChecksumHaveEveryEntryChecked) {
  const std::string archive = without_comment(bridge_archive());
  ASSERT_EQ(verify_zip_archive(archive), ZipCheck::kEntries);
  for (const ZipEntry& entry : read_zip_directory(archive)) {
    SCOPED_TRACE(entry.name);
    for (const uint64_t offset : {entry.local_header_offset, entry.local_header_offset + 14, entry.data_offset,
                                  entry.data_offset + entry.size - 1}) {
      if (entry.size == 0 && offset >= entry.data_offset) continue;
      std::string damaged = archive;
      damaged[offset] = static_cast<char>(damaged[offset] ^ 0x10);
      EXPECT_THROW(verify_zip_archive(damaged), DamagedFileError) << "offset " << offset;
    }
  }
  // The entry's data: the message names the entry and both CRCs.
  const ZipEntry entry = read_zip_directory(archive).front();
  std::string damaged = archive;
  damaged[entry.data_offset] = static_cast<char>(damaged[entry.data_offset] ^ 0x10);
  try {
    verify_zip_archive(damaged);
    ADD_FAILURE() << "damage not found";
  } catch (const DamagedFileError& error) {
    EXPECT_THAT(error.what(), HasSubstr("entry '" + entry.name + "'"));
    EXPECT_THAT(error.what(), HasSubstr("has CRC32"));
  }
}

TEST(ZipArchive, TorchSaveFilesVerifyByTheirEntries) {
  const fs::path seed = fs::path(BRIDGE_SOURCE_DIR) / "fuzz/corpus/fuzz_checkpoint/list_and_tuple.pt";
  EXPECT_EQ(verify_zip_archive(read_file(seed)), ZipCheck::kEntries);
}

TEST(ZipArchive, AForeignCommentIsDamage) {
  std::string archive = bridge_archive();
  archive[archive.size() - 21] = 'B';  // "Bridge-crc32=..."
  EXPECT_THROW(verify_zip_archive(archive), DamagedFileError);
}

// The sink holds back the end record however the bytes arrive: one at a time or all at once, the same file.
TEST(ZipArchive, TheSinkWritesTheSameArchiveHoweverItIsSplit) {
  const std::string plain = without_comment(bridge_archive());
  std::string whole, bytewise, uneven;
  ChecksummedZipSink a([&](const char* data, std::size_t size) { whole.append(data, size); });
  a.write(plain.data(), plain.size());
  a.finish();
  ChecksummedZipSink b([&](const char* data, std::size_t size) { bytewise.append(data, size); });
  for (const char c : plain) b.write(&c, 1);
  b.finish();
  ChecksummedZipSink c([&](const char* data, std::size_t size) { uneven.append(data, size); });
  for (std::size_t at = 0, step = 1; at < plain.size(); at += step, step = step * 3 % 37 + 1) {
    c.write(plain.data() + at, std::min(step, plain.size() - at));
  }
  c.finish();
  EXPECT_EQ(whole, bridge_archive());
  EXPECT_EQ(bytewise, whole);
  EXPECT_EQ(uneven, whole);
  ChecksummedZipSink not_a_zip([](const char*, std::size_t) {});
  not_a_zip.write("hello", 5);
  EXPECT_THROW(not_a_zip.finish(), std::logic_error);
}

TEST(ZipArchive, LoadTorchPickleRefusesADamagedFileNamingIt) {
  std::string archive = bridge_archive();
  archive[archive.size() / 2] = static_cast<char>(archive[archive.size() / 2] ^ 1);
  const fs::path path = scratch("damaged.pt");
  write_file_durably(path, archive);
  try {
    load_torch_pickle(path);
    ADD_FAILURE() << "a damaged file loaded";
  } catch (const DamagedFileError& error) {
    EXPECT_THAT(error.what(), HasSubstr(path.string() + " is damaged"));
    EXPECT_THAT(error.what(), HasSubstr("restore it from a copy"));
  }
  ZipCheck check = ZipCheck::kEntries;
  write_file_durably(path, bridge_archive());
  EXPECT_TRUE(load_torch_pickle(path, &check).isGenericDict());
  EXPECT_EQ(check, ZipCheck::kWholeFile);
  fs::remove_all(path.parent_path());
}

}  // namespace
}  // namespace bridge::utils
