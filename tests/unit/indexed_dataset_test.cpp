// The indexed dataset reader against files written by an independent Python port of Megatron-Core's writer (uint16
// and int32 tokens, every array unaligned), the C++ builder byte for byte against the same writer, and damaged files
// (truncations, bad header fields, counts and pointers past the end, random bit flips) as clear errors.
#include "training/datasets/indexed_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>

#include "tests/unit/datasets_test_support.h"

namespace bridge::training::datasets {
namespace {

using ::testing::HasSubstr;
using testing::known_document;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;
using testing::write_reference_dataset;

TEST(IndexedDatasetTest, OptimalDtypeFollowsMegatron) {
  EXPECT_EQ(optimal_dtype(257), DType::kUInt16);
  EXPECT_EQ(optimal_dtype(65499), DType::kUInt16);
  EXPECT_EQ(optimal_dtype(65500), DType::kInt32);
  EXPECT_EQ(optimal_dtype(50257), DType::kUInt16);
  EXPECT_EQ(static_cast<int>(DType::kUInt16), 8);
  EXPECT_EQ(static_cast<int>(DType::kInt32), 4);
  EXPECT_EQ(dtype_size(DType::kUInt16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat64), 8u);
  EXPECT_THROW(optimal_dtype(0), std::invalid_argument);
}

// 5 and 6 sequences put the pointer and document arrays at offsets 2 and 6 mod 8; the lengths are at 34 (2 mod 4).
TEST(IndexedDatasetTest, ReadsMegatronFilesOfUint16AndInt32AtUnalignedOffsets) {
  ScratchDir dir;
  for (const std::string dtype : {"uint16", "int32"}) {
    for (const int count : {5, 6, 1}) {
      SCOPED_TRACE(dtype + " x " + std::to_string(count));
      const std::string prefix = dir / (dtype + std::to_string(count));
      write_reference_dataset(prefix, dtype, count);
      const bool uint16 = dtype == "uint16";
      IndexedDataset dataset(prefix);
      EXPECT_EQ(dataset.dtype(), uint16 ? DType::kUInt16 : DType::kInt32);
      ASSERT_EQ(dataset.size(), count);
      std::vector<int64_t> expected_documents;
      int64_t pointer = 0;
      for (int i = 0; i < count; ++i) {
        const std::vector<int64_t> expected = known_document(i, uint16);
        EXPECT_EQ(dataset.sequence_lengths()[static_cast<std::size_t>(i)], static_cast<int32_t>(expected.size()));
        EXPECT_EQ(dataset.sequence_pointers()[static_cast<std::size_t>(i)], pointer);
        pointer += static_cast<int64_t>(expected.size()) * (uint16 ? 2 : 4);
        EXPECT_EQ(dataset.get(i), expected);
        std::vector<int64_t> into(expected.size() + 1, -7);  // read() writes `length` tokens and nothing past them
        EXPECT_EQ(dataset.read(i, 0, static_cast<int64_t>(expected.size()), into.data()),
                  static_cast<int64_t>(expected.size()));
        EXPECT_EQ(std::vector<int64_t>(into.begin(), into.end() - 1), expected);
        EXPECT_EQ(into.back(), -7);
        if (expected.size() >= 3) {
          EXPECT_EQ(dataset.get(i, 1, 2), std::vector<int64_t>(expected.begin() + 1, expected.begin() + 3));
          EXPECT_EQ(dataset.get(i, 2), std::vector<int64_t>(expected.begin() + 2, expected.end()));
        }
        expected_documents.push_back(i);
      }
      expected_documents.push_back(count);
      EXPECT_EQ(dataset.document_indices(), expected_documents);
      if (!uint16 && count > 1) {
        EXPECT_GT(dataset.get(1)[1], 65535) << "int32 content must exceed uint16";
      }
    }
  }
}

TEST(IndexedDatasetTest, GetOutsideASequenceThrows) {
  ScratchDir dir;
  write_reference_dataset(dir / "d", "uint16", 3);
  IndexedDataset dataset(dir / "d");
  const int64_t length = dataset.sequence_lengths()[1];
  EXPECT_THROW(dataset.get(-1), std::out_of_range);
  EXPECT_THROW(dataset.get(3), std::out_of_range);
  EXPECT_THROW(dataset.get(1, length + 1), std::out_of_range);
  EXPECT_THROW(dataset.get(1, 0, length + 1), std::out_of_range);
  EXPECT_THROW(dataset.get(1, -1, 1), std::out_of_range);
  EXPECT_TRUE(dataset.get(1, length).empty());
}

TEST(IndexedDatasetBuilderTest, WritesFilesByteIdenticalToMegatron) {
  ScratchDir dir;
  for (const std::string dtype : {"uint16", "int32"}) {
    SCOPED_TRACE(dtype);
    const bool uint16 = dtype == "uint16";
    write_reference_dataset(dir / ("py_" + dtype), dtype, 7);
    IndexedDatasetBuilder builder(dir / ("cpp_" + dtype), uint16 ? DType::kUInt16 : DType::kInt32);
    // The same documents converted beforehand, as preprocess_data's workers do, with two sequences each.
    IndexedDatasetBuilder converted(dir / ("bytes_" + dtype), uint16 ? DType::kUInt16 : DType::kInt32);
    for (int i = 0; i < 7; ++i) {
      builder.add_document(known_document(i, uint16));
      const std::vector<int64_t> tokens = known_document(i, uint16);
      std::vector<unsigned char> bytes;
      append_token_bytes(tokens.data(), 1, converted.dtype(), bytes);
      append_token_bytes(tokens.data() + 1, tokens.size() - 1, converted.dtype(), bytes);
      converted.add_document_bytes(bytes, {static_cast<int64_t>(tokens.size())});
    }
    EXPECT_FALSE(testing::fs::exists(dir / ("cpp_" + dtype + ".idx"))) << "the files must appear only at finalize";
    builder.finalize();
    converted.finalize();
    EXPECT_EQ(builder.num_documents(), 7);
    for (const std::string ext : {".bin", ".idx"}) {
      const std::string ours = read_bytes(dir / ("cpp_" + dtype + ext));
      ASSERT_FALSE(ours.empty());
      EXPECT_EQ(ours, read_bytes(dir / ("py_" + dtype + ext))) << ext;
      EXPECT_EQ(read_bytes(dir / ("bytes_" + dtype + ext)), ours) << ext;
    }
  }
  // Nothing but the finished files is left behind.
  int files = 0;
  for (const auto& entry : testing::fs::directory_iterator(dir.path())) {
    EXPECT_THAT(entry.path().string(), ::testing::Not(HasSubstr(".tmp"))) << entry.path();
    ++files;
  }
  EXPECT_EQ(files, 12);
}

TEST(IndexedDatasetBuilderTest, ConvertedDocumentsAreCheckedLikeTokens) {
  ScratchDir dir;
  IndexedDatasetBuilder builder(dir / "converted", DType::kUInt16);
  std::vector<unsigned char> bytes;
  const std::vector<int64_t> tokens{7, 65535, 65536, 1};
  try {
    append_token_bytes(tokens.data(), tokens.size(), DType::kUInt16, bytes);
    FAIL() << "65536 does not fit uint16";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("token 65536 (position 2) does not fit uint16"));
  }
  EXPECT_TRUE(bytes.empty()) << "a token that does not fit appends nothing";
  EXPECT_THROW(append_token_bytes(tokens.data(), 1, DType::kFloat32, bytes), std::invalid_argument);
  append_token_bytes(tokens.data(), 2, DType::kUInt16, bytes);
  EXPECT_EQ(bytes, (std::vector<unsigned char>{7, 0, 255, 255}));
  EXPECT_THROW(builder.add_document_bytes(bytes, {1}), std::invalid_argument);      // lengths sum to 1 of 2 tokens
  EXPECT_THROW(builder.add_document_bytes({1, 2, 3}, {1}), std::invalid_argument);  // half a token
  builder.add_document_bytes(bytes, {1, 1});
  builder.finalize();
  EXPECT_THROW(builder.add_document_bytes(bytes, {2}), std::logic_error);
  IndexedDataset dataset(dir / "converted");
  EXPECT_EQ(dataset.document_indices(), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(dataset.get(1), (std::vector<int64_t>{65535}));
}

TEST(IndexedDatasetBuilderTest, FinalizeReplacesAnEarlierDatasetOfThePrefix) {
  ScratchDir dir;
  for (const int64_t documents : {40, 3}) {
    IndexedDatasetBuilder builder(dir / "again", DType::kUInt16);
    for (int64_t d = 0; d < documents; ++d) builder.add_document(std::vector<int64_t>(100, documents + d));
    builder.finalize();
  }
  IndexedDataset dataset(dir / "again");
  EXPECT_EQ(dataset.size(), 3);
  EXPECT_EQ(dataset.get(2), std::vector<int64_t>(100, 5));
  EXPECT_EQ(dataset.num_bytes(), 3u * 100 * 2);
  int files = 0;
  for (const auto& entry : testing::fs::directory_iterator(dir.path())) {
    EXPECT_THAT(entry.path().string(), ::testing::Not(HasSubstr(".tmp"))) << entry.path();
    ++files;
  }
  EXPECT_EQ(files, 2);
}

TEST(IndexedDatasetBuilderTest, SeveralSequencesPerDocumentAndEmptyDocuments) {
  ScratchDir dir;
  IndexedDatasetBuilder builder(dir / "multi", DType::kUInt16);
  builder.add_document({1, 2, 3, 4, 5}, {2, 3});
  builder.add_document({}, {});  // empty text: a document without sequences, as preprocess_data.py writes it
  builder.add_item({9});
  builder.add_item({});
  builder.end_document();
  EXPECT_THROW(builder.add_document({1, 2}, {3}), std::invalid_argument);
  builder.finalize();
  EXPECT_THROW(builder.add_document({1}), std::logic_error);
  IndexedDataset dataset(dir / "multi");
  EXPECT_EQ(dataset.size(), 4);
  EXPECT_EQ(dataset.document_indices(), (std::vector<int64_t>{0, 2, 2, 4}));
  EXPECT_EQ(dataset.get(0), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(dataset.get(1), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(dataset.get(2), (std::vector<int64_t>{9}));
  EXPECT_TRUE(dataset.get(3).empty());
}

TEST(IndexedDatasetBuilderTest, RejectsTokensOutsideTheDtypeAndCleansUp) {
  ScratchDir dir;
  {
    IndexedDatasetBuilder builder(dir / "narrow", DType::kUInt16);
    builder.add_document({0, 65535});
    try {
      builder.add_document({1, 65536});
      FAIL() << "65536 does not fit uint16";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("65536"));
      EXPECT_THAT(e.what(), HasSubstr("uint16"));
    }
    EXPECT_THROW(builder.add_document({-1}), std::invalid_argument);
  }  // not finalized: the temporary .bin goes away
  EXPECT_TRUE(testing::fs::is_empty(dir.path()));
  EXPECT_THROW(IndexedDatasetBuilder(dir / "f", DType::kFloat32), std::invalid_argument);
  EXPECT_THROW(IndexedDatasetBuilder(dir / "missing/folder/x", DType::kUInt16), std::runtime_error);
}

// Expects opening `prefix` to fail with a runtime_error whose message holds every one of `parts`.
void expect_damaged(const std::string& prefix, const std::vector<std::string>& parts) {
  try {
    IndexedDataset dataset(prefix);
    ADD_FAILURE() << "opened a damaged dataset";
  } catch (const std::runtime_error& e) {
    for (const auto& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

TEST(IndexedDatasetTest, DamagedFilesAreClearErrors) {
  ScratchDir dir;
  const std::string good = dir / "good";
  write_reference_dataset(good, "uint16", 5);
  const std::string idx = read_bytes(good + ".idx"), bin = read_bytes(good + ".bin");
  const std::size_t n = 5, header = 34;
  ASSERT_EQ(idx.size(), header + 12 * n + 8 * (n + 1));
  const std::string bad = dir / "bad";
  const auto with = [&](std::string new_idx, std::string new_bin) {
    write_bytes(bad + ".idx", new_idx);
    write_bytes(bad + ".bin", new_bin);
  };
  const auto patched = [&](std::size_t at, const void* value, std::size_t size) {
    std::string copy = idx;
    std::memcpy(copy.data() + at, value, size);
    return copy;
  };

  for (const std::size_t size : {std::size_t{0}, std::size_t{8}, std::size_t{33}}) {
    with(idx.substr(0, size), bin);
    expect_damaged(bad, {bad + ".idx", "at least 34 bytes", "has " + std::to_string(size)});
  }
  with(idx.substr(0, header + 4 * n - 1), bin);
  expect_damaged(bad, {bad + ".idx", "sequence_count 5"});
  with(idx.substr(0, idx.size() - 1), bin);
  expect_damaged(bad, {bad + ".idx", "document_count 6"});
  with(idx + "xyz", bin);
  expect_damaged(bad, {bad + ".idx", "the file has " + std::to_string(idx.size() + 3) + " bytes"});
  with(idx, bin.substr(0, bin.size() - 1));
  expect_damaged(bad, {bad + ".bin", "has " + std::to_string(bin.size() - 1) + " bytes", "sequence 4"});
  testing::fs::remove(bad + ".bin");
  write_bytes(bad + ".idx", idx);
  expect_damaged(bad, {"cannot open " + bad + ".bin"});
  expect_damaged(dir / "absent", {"cannot open " + dir / "absent.idx"});

  with(patched(0, "X", 1), bin);
  expect_damaged(bad, {"bad magic"});
  const uint64_t version = 2;
  with(patched(9, &version, 8), bin);
  expect_damaged(bad, {"version is 2"});
  for (const uint8_t code : {uint8_t{0}, uint8_t{9}}) {
    with(patched(17, &code, 1), bin);
    expect_damaged(bad, {"dtype code is " + std::to_string(code)});
  }
  const uint64_t huge = uint64_t{1} << 62;
  with(patched(18, &huge, 8), bin);
  expect_damaged(bad, {"sequence_count " + std::to_string(huge)});
  with(patched(26, &huge, 8), bin);
  expect_damaged(bad, {"document_count " + std::to_string(huge)});
  const int32_t negative = -3;
  with(patched(header, &negative, 4), bin);
  expect_damaged(bad, {"sequence_lengths[0] is -3"});
  const int64_t past_end = static_cast<int64_t>(bin.size());
  with(patched(header + 4 * n + 8 * (n - 1), &past_end, 8), bin);
  expect_damaged(bad, {"sequence 4", "spans bytes [" + std::to_string(past_end)});
  const int64_t before_start = -8;
  with(patched(header + 4 * n, &before_start, 8), bin);
  expect_damaged(bad, {"sequence 0", "spans bytes [-8"});
  // In-range damage (lengths 1, 8, 2, 9, 3): what still fits inside the .bin but would read the wrong tokens.
  int32_t length_flip = 8 ^ 1;
  with(patched(header + 4 * 1, &length_flip, 4), bin);
  expect_damaged(bad, {"sequence_pointers[2] is 18", "hold 10 tokens = 20 bytes of uint16", "damaged sequence length"});
  const int64_t pointer_flip = 18 ^ 2;
  with(patched(header + 4 * n + 8 * 2, &pointer_flip, 8), bin);
  expect_damaged(bad, {"sequence_pointers[2] is 16", "hold 9 tokens = 18 bytes"});
  length_flip = 3 ^ 1;
  with(patched(header + 4 * 4, &length_flip, 4), bin);
  expect_damaged(bad, {"its sequences hold 22 tokens = 44 bytes of uint16", "has 46 bytes"});
  with(idx, bin + "xy");
  expect_damaged(bad, {"its sequences hold 23 tokens", bad + ".bin has 48 bytes"});
  const uint8_t uint8_code = 1;  // uint16 -> uint8: every sequence would still fit, at half the size
  with(patched(17, &uint8_code, 1), bin);
  expect_damaged(bad, {"sequence_pointers[1] is 2", "bytes of uint8", "2-byte tokens: is the dtype code"});
  const int64_t backwards = 0;
  with(patched(header + 12 * n + 8 * 3, &backwards, 8), bin);
  expect_damaged(bad, {"document_indices[3] is 0"});
  const int64_t beyond = 9;
  with(patched(header + 12 * n + 8 * n, &beyond, 8), bin);
  expect_damaged(bad, {"document_indices[5] is 9"});
}

// Float tokens (dtype codes 6 and 7, which Megatron's reader accepts) are truncated toward zero like numpy's
// astype(int64); one that no int64 holds reads as kNotAToken, which the vocabulary check reports (the libFuzzer
// target found the plain cast's undefined behaviour).
TEST(IndexedDatasetTest, FloatTokensPastInt64ReadAsNotAToken) {
  ScratchDir dir;
  const std::string good = dir / "good";
  write_reference_dataset(good, "uint16", 5);  // 23 tokens: sequence 0 has 1, sequence 1 has 8
  const std::string idx = read_bytes(good + ".idx");
  const double specials[] = {-2.75, std::nan(""), 1e30, -1e19, 9.0, -std::numeric_limits<double>::infinity()};
  for (const uint8_t code : {uint8_t{6}, uint8_t{7}}) {
    SCOPED_TRACE(code == 6 ? "float64" : "float32");
    std::string new_idx = idx, bin;
    new_idx[17] = static_cast<char>(code);
    const int64_t item = code == 6 ? 8 : 4, starts[] = {0, 1, 9, 11, 20};  // pointers in bytes of the new dtype
    for (int s = 0; s < 5; ++s) {
      const int64_t pointer = starts[s] * item;
      std::memcpy(new_idx.data() + 34 + 4 * 5 + 8 * s, &pointer, 8);
    }
    for (int i = 0; i < 23; ++i) {
      const double value = i >= 1 && i <= 6 ? specials[i - 1] : 4.0;
      const float narrow = static_cast<float>(value);
      bin.append(code == 6 ? reinterpret_cast<const char*>(&value) : reinterpret_cast<const char*>(&narrow),
                 code == 6 ? 8 : 4);
    }
    const std::string prefix = dir / ("float" + std::to_string(code));
    write_bytes(prefix + ".idx", new_idx);
    write_bytes(prefix + ".bin", bin);
    const IndexedDataset dataset(prefix);
    EXPECT_EQ(dataset.get(0), std::vector<int64_t>{4});
    EXPECT_EQ(dataset.get(1, 0, 6), (std::vector<int64_t>{-2, kNotAToken, kNotAToken, kNotAToken, 9, kNotAToken}));
    const std::optional<TokenLocation> bad = dataset.find_token_outside(10);
    ASSERT_TRUE(bad.has_value());
    EXPECT_EQ(bad->sequence, 1);
    EXPECT_EQ(bad->position, 0);
    EXPECT_EQ(bad->value, -2);
  }
}

// Random truncations and bit flips: the reader either opens the files and then reads every sequence inside the
// .bin, or throws runtime_error; it never crashes or reads out of bounds (the ASan build checks the latter). Only a
// flip in the document indices that keeps them ordered can go unnoticed: every token is still read from its place.
TEST(IndexedDatasetTest, RandomDamageNeverCrashes) {
  ScratchDir dir;
  const std::string good = dir / "good";
  write_reference_dataset(good, "int32", 9);
  const std::string idx = read_bytes(good + ".idx"), bin = read_bytes(good + ".bin");
  const std::string bad = dir / "bad";
  std::mt19937 random(7);
  int opened = 0, rejected = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string new_idx = idx, new_bin = bin;
    const int kind = trial % 3;
    std::size_t flipped = 0;
    if (kind == 0) {
      new_idx.resize(random() % idx.size());
    } else if (kind == 1) {
      flipped = random() % idx.size();
      new_idx[flipped] ^= static_cast<char>(1 << (random() % 8));
    } else {
      new_bin.resize(random() % bin.size());
    }
    write_bytes(bad + ".idx", new_idx);
    write_bytes(bad + ".bin", new_bin);
    try {
      IndexedDataset dataset(bad);
      int64_t total = 0;
      for (int64_t i = 0; i < dataset.size(); ++i) total += static_cast<int64_t>(dataset.get(i).size());
      EXPECT_EQ(total * static_cast<int64_t>(dtype_size(dataset.dtype())), static_cast<int64_t>(new_bin.size()));
      EXPECT_EQ(kind, 1);
      EXPECT_GE(flipped, 34u + 12u * 9u) << "a flip outside the document indices was accepted";
      ++opened;
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr(bad));
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 280);  // every truncation, and every flip of the header, a length or a pointer
}

// A .bin truncated while mapped (rewritten by another job, a failing disk) raises SIGBUS on the next read; the
// handler names the file before the process ends. (Under AddressSanitizer its own handler ends it with an error.)
TEST(IndexedDatasetDeathTest, ABinThatShrinksWhileMappedIsNamedOnSigbus) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ScratchDir dir;
  const std::string prefix = dir / "shrinks";
  IndexedDatasetBuilder builder(prefix, DType::kUInt16);
  builder.add_document(std::vector<int64_t>(10000, 7));
  builder.finalize();
  const auto died_of_the_fault = [](int status) {
    return (WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
  };
  EXPECT_EXIT(
      {
        IndexedDataset dataset(prefix);
        testing::fs::resize_file(prefix + ".bin", 0);
        dataset.get(0, 9000, 10);
      },
      died_of_the_fault, "SIGBUS reading [^ ]*shrinks\\.bin at byte 18000 of the 20000 it had when opened");
}

}  // namespace
}  // namespace bridge::training::datasets
