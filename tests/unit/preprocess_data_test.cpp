// preprocess_data and bridge-preprocess-data: JSON lines and text paragraphs in, .bin/.idx out, read back with the
// indexed dataset reader; bad input fails with the file and line and leaves no files; bad flags exit with status 2.
// Most cases run in process; the program itself runs a few times (each start loads LibTorch, about a second).
#include "training/datasets/preprocess_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "tests/unit/datasets_test_support.h"
#include "training/datasets/indexed_dataset.h"
#include "training/datasets/tokenizer.h"

namespace bridge::training::datasets {
namespace {

using ::testing::HasSubstr;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

struct ToolRun {
  int status;
  std::string err;
};

ToolRun preprocess(const ScratchDir& dir, const std::string& args) {
  const std::string err = dir / "stderr.txt";
  const std::string command =
      "'" BRIDGE_PREPROCESS_DATA "' " + args + " > '" + dir / "stdout.txt" + "' 2> '" + err + "'";
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_bytes(err)};
}

std::vector<int64_t> bytes_of(const std::string& text) { return ByteLevelTokenizer().encode(text); }

std::vector<int64_t> with_eod(std::vector<int64_t> tokens) {
  tokens.push_back(ByteLevelTokenizer::kEod);
  return tokens;
}

TEST(PreprocessDataTest, JsonLinesBecomeDocuments) {
  ScratchDir dir;
  write_bytes(dir / "corpus.jsonl",
              "{\"text\": \"hello\", \"id\": 1}\n"
              "\n"
              "{\"text\": \"\"}\n"
              "{\"text\": [\"ab\", \"\", \"c\\u00e9\"]}\n");
  const ToolRun run = preprocess(dir, "--input '" + dir / "corpus.jsonl" + "' --output-prefix '" + dir / "out" +
                                          "' --append-eod --log-interval 0");
  ASSERT_EQ(run.status, 0) << run.err;
  IndexedDataset dataset(dir / "out_text_document");
  EXPECT_EQ(dataset.dtype(), DType::kUInt16);
  // "hello" + EOD; the empty text a document without sequences; the list one sequence per non-empty string, EOD
  // after the last, as Megatron's preprocess_data.py writes them.
  EXPECT_EQ(dataset.document_indices(), (std::vector<int64_t>{0, 1, 1, 3}));
  ASSERT_EQ(dataset.size(), 3);
  EXPECT_EQ(dataset.get(0), with_eod(bytes_of("hello")));
  EXPECT_EQ(dataset.get(1), bytes_of("ab"));
  EXPECT_EQ(dataset.get(2), with_eod(bytes_of("cé")));
  EXPECT_THAT(read_bytes(dir / "stdout.txt"), HasSubstr(dir / "out_text_document.bin/.idx: 3 documents, 12 tokens"));
}

PreprocessConfig in_process(const ScratchDir& dir, const std::string& input) {
  PreprocessConfig config;
  config.input = input;
  config.output_prefix = dir / "out";
  return config;
}

TEST(PreprocessDataTest, SeveralJsonKeysGiveOneDatasetEach) {
  ScratchDir dir;
  write_bytes(dir / "corpus.jsonl", "{\"text\": \"a\", \"title\": \"T\"}\n{\"text\": \"bc\", \"title\": \"U\"}\n");
  PreprocessConfig config = in_process(dir, dir / "corpus.jsonl");
  config.json_keys = {"text", "title"};
  const std::vector<PreprocessedDataset> written = preprocess_data(config);
  ASSERT_EQ(written.size(), 2u);
  EXPECT_EQ(written[1].path_prefix, dir / "out_title_document");
  EXPECT_EQ(written[1].documents, 2);
  EXPECT_EQ(written[0].tokens, 3);
  EXPECT_EQ(IndexedDataset(dir / "out_text_document").get(1), bytes_of("bc"));
  EXPECT_EQ(IndexedDataset(dir / "out_title_document").get(1), bytes_of("U"));
}

TEST(PreprocessDataTest, TextParagraphsBecomeDocuments) {
  ScratchDir dir;
  write_bytes(dir / "book.txt", "\nFirst line\n  second line\n\n \t\nPara two\r\nends here\r\n\n\nLast");
  const ToolRun run =
      preprocess(dir, "--input '" + dir / "book.txt" + "' --input-format text --output-prefix '" + dir / "book" + "'");
  ASSERT_EQ(run.status, 0) << run.err;
  IndexedDataset dataset(dir / "book_text_document");
  ASSERT_EQ(dataset.size(), 3);
  EXPECT_EQ(dataset.get(0), bytes_of("First line\n  second line"));
  EXPECT_EQ(dataset.get(1), bytes_of("Para two\nends here"));
  EXPECT_EQ(dataset.get(2), bytes_of("Last"));
}

TEST(PreprocessDataTest, BadInputNamesFileAndLineAndLeavesNoFiles) {
  ScratchDir dir;
  const auto expect_failure = [&](const std::string& content, std::vector<std::string> keys, const std::string& part) {
    write_bytes(dir / "bad.jsonl", content);
    PreprocessConfig config = in_process(dir, dir / "bad.jsonl");
    config.json_keys = std::move(keys);
    try {
      preprocess_data(config);
      ADD_FAILURE() << "accepted " << content;
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr(part)) << content;
    }
    for (const auto& entry : testing::fs::directory_iterator(dir.path())) {
      EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr("out_"))) << "left behind";
    }
  };
  expect_failure("{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n", {"text"},
                 dir / "bad.jsonl" + ":2: not a JSON object");
  expect_failure("{\"text\": \"ok\"}\n\n[1, 2]\n", {"text"},
                 dir / "bad.jsonl" + ":3: the line is JSON but not an object");
  expect_failure("{\"body\": \"x\"}\n", {"text"}, ":1: no field \"text\" (the line has: body)");
  expect_failure("{\"text\": 5}\n", {"text"}, ":1: field \"text\" must be a string or a list of strings, got number");
  expect_failure("{\"text\": \"a\"}\n", {"text", "title"}, ":1: no field \"title\"");
  PreprocessConfig absent = in_process(dir, dir / "absent.jsonl");
  try {
    preprocess_data(absent);
    ADD_FAILURE() << "read an absent file";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot open the input " + dir / "absent.jsonl"));
  }
}

TEST(PreprocessDataTest, ProgramReportsBadInputWithStatus1) {
  ScratchDir dir;
  write_bytes(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  const ToolRun run = preprocess(dir, "--input '" + dir / "bad.jsonl" + "' --output-prefix '" + dir / "out" + "'");
  EXPECT_EQ(run.status, 1);
  EXPECT_THAT(run.err, HasSubstr(dir / "bad.jsonl" + ":2: not a JSON object"));
  EXPECT_FALSE(testing::fs::exists(dir / "out_text_document.idx"));
}

TEST(PreprocessDataTest, BadFlagsExitWithStatus2) {
  ScratchDir dir;
  write_bytes(dir / "c.jsonl", "{\"text\": \"a\"}\n");
  const std::string io = "--input '" + dir / "c.jsonl" + "' --output-prefix '" + dir / "o" + "' ";
  const auto expect_usage_error = [&](const std::string& args, const std::string& part) {
    const ToolRun run = preprocess(dir, args);
    EXPECT_EQ(run.status, 2) << args;
    EXPECT_THAT(run.err, HasSubstr(part)) << args;
  };
  expect_usage_error("--output-prefix x", "--input is required");
  expect_usage_error(io + "--tokenizer-type ByteLevl", "did you mean ByteLevel?");
  expect_usage_error(io + "--input-format csv", "--input-format must be json or text");
  const ToolRun help = preprocess(dir, "--help");
  EXPECT_EQ(help.status, 0);
  for (const std::string flag : {"--input", "--input-format", "--output-prefix", "--json-keys", "--tokenizer-type",
                                 "--vocab-file", "--merge-file", "--append-eod", "--log-interval", "--workers"}) {
    EXPECT_THAT(read_bytes(dir / "stdout.txt"), HasSubstr(flag));
  }
}

}  // namespace
}  // namespace bridge::training::datasets
