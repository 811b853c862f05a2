// preprocess_data and bridge-preprocess-data: JSON lines and text paragraphs in, .bin/.idx out, read back with the
// indexed dataset reader; Megatron's flags (space-separated --json-keys, --workers and --partitions, which leave the
// output byte-identical or deal it as Megatron's do, --split-sentences, --keep-newlines); bad input fails with the
// file and line and leaves no files; bad flags exit with status 2.
// Most cases run in process; the program itself runs a few times (each start loads LibTorch, about a second).
#include "training/datasets/preprocess_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/datasets_test_support.h"
#include "training/datasets/indexed_dataset.h"
#include "training/datasets/sentence_splitter.h"
#include "training/tokenizers/byte_level_tokenizer.h"

namespace bridge::training::datasets {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;
using tokenizers::ByteLevelTokenizer;

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

// The reader takes the input 1 MiB at a time: lines that span several reads, one that ends exactly at a read's end,
// and a last line without a newline are read whole, and line numbers still count every line.
TEST(PreprocessDataTest, LinesLongerThanTheReaderBufferAreReadWhole) {
  ScratchDir dir;
  const std::size_t mib = std::size_t{1} << 20;
  const std::string prefix = "{\"text\": \"";
  const std::string suffix = "\"}";
  const std::string long_text(mib * 5 / 2, 'x');
  // The second line ends with its newline as the last byte of the third read.
  const std::size_t first = prefix.size() + long_text.size() + suffix.size() + 1;
  const std::string fitted_text(3 * mib - first - prefix.size() - suffix.size() - 1, 'y');
  std::string content = prefix + long_text + suffix + "\n" + prefix + fitted_text + suffix + "\n";
  ASSERT_EQ(content.size(), 3 * mib);
  content += "{\"text\": \"end\"}";
  write_bytes(dir / "long.jsonl", content);
  PreprocessConfig config = in_process(dir, dir / "long.jsonl");
  preprocess_data(config);
  IndexedDataset dataset(dir / "out_text_document");
  ASSERT_EQ(dataset.size(), 3);
  EXPECT_EQ(dataset.get(0), bytes_of(long_text));
  EXPECT_EQ(dataset.get(1), bytes_of(fitted_text));
  EXPECT_EQ(dataset.get(2), bytes_of("end"));
  write_bytes(dir / "long.jsonl", content + "\n\n{\"text\": 1}");
  try {
    preprocess_data(config);
    ADD_FAILURE() << "accepted a number for text";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir / "long.jsonl" + ":5: field \"text\""));
  }
}

// Text paragraphs across reads: a "\r\n" whose '\r' ends one read and whose '\n' starts the next, inside a line that
// began in the first read, and a paragraph longer than a read.
TEST(PreprocessDataTest, ParagraphsAndLineEndsAcrossTheReaderBuffer) {
  ScratchDir dir;
  const std::size_t mib = std::size_t{1} << 20;
  const std::string first = "para one\r\n";
  const std::string straddling(mib - 1 - first.size(), 'b');  // its '\r' is the read's last byte
  const std::string long_line(mib * 3 / 2, 'c');
  write_bytes(dir / "book.txt", first + straddling + "\r\n\r\npara two " + long_line + "\r\nsecond line\r\n");
  PreprocessConfig config = in_process(dir, dir / "book.txt");
  config.input_format = InputFormat::kText;
  preprocess_data(config);
  IndexedDataset dataset(dir / "out_text_document");
  ASSERT_EQ(dataset.size(), 2);
  EXPECT_EQ(dataset.get(0), bytes_of("para one\n" + straddling));
  EXPECT_EQ(dataset.get(1), bytes_of("para two " + long_line + "\nsecond line"));
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
  // An input that cannot be opened, or read (a folder: reading it fails, which is no empty corpus).
  testing::fs::create_directory(dir / "folder.jsonl");
  for (const auto& [input, part] : {std::pair<std::string, std::string>{"absent.jsonl", "cannot open the input "},
                                    {"folder.jsonl", "cannot read the input "}}) {
    try {
      preprocess_data(in_process(dir, dir / input));
      ADD_FAILURE() << "read " << input;
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr(part + dir / input));
    }
  }
  EXPECT_FALSE(testing::fs::exists(dir / "out_text_document.bin"));
}

TEST(PreprocessDataTest, ProgramReportsBadInputWithStatus1) {
  ScratchDir dir;
  write_bytes(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  const ToolRun run = preprocess(dir, "--input '" + dir / "bad.jsonl" + "' --output-prefix '" + dir / "out" + "'");
  EXPECT_EQ(run.status, 1);
  EXPECT_THAT(run.err, HasSubstr(dir / "bad.jsonl" + ":2: not a JSON object"));
  EXPECT_FALSE(testing::fs::exists(dir / "out_text_document.idx"));
}

// Every example writes to data/...: the output's folder is made, folders on the way included, and what is already in
// one is kept; a file in its way is an error naming the folder. A failed start makes no folder.
TEST(PreprocessDataTest, ProgramMakesTheOutputFolder) {
  ScratchDir dir;
  write_bytes(dir / "c.jsonl", "{\"text\": \"ab\"}\n");
  const std::string input = "--input '" + dir / "c.jsonl" + "' --append-eod --output-prefix '";
  const ToolRun nested = preprocess(dir, input + dir / "data/deeper/corpus" + "'");
  ASSERT_EQ(nested.status, 0) << nested.err;
  EXPECT_EQ(IndexedDataset(dir / "data/deeper/corpus_text_document").get(0), with_eod(bytes_of("ab")));
  write_bytes(dir / "data/kept.txt", "mine");
  ASSERT_EQ(preprocess(dir, input + dir / "data/corpus" + "'").status, 0);
  EXPECT_EQ(read_bytes(dir / "data/kept.txt"), "mine");
  EXPECT_TRUE(testing::fs::exists(dir / "data/deeper/corpus_text_document.idx"));
  write_bytes(dir / "blocker", "a file");
  const ToolRun blocked = preprocess(dir, input + dir / "blocker/sub/corpus" + "'");
  EXPECT_EQ(blocked.status, 1);
  EXPECT_THAT(blocked.err, HasSubstr("cannot make the output folder " + dir / "blocker/sub"));
  const ToolRun bad = preprocess(dir, "--input '" + dir / "absent.jsonl" + "' --output-prefix '" + dir / "new/c" + "'");
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("cannot open the input " + dir / "absent.jsonl"));
  EXPECT_FALSE(testing::fs::exists(dir / "new"));
}

// Loading LibTorch costs 0.45 s and 480 MB before main() (a third of a 20 MB corpus's time on two workers), and the
// program needs none of it: the dynamic loader's list of what it maps must hold no LibTorch library.
TEST(PreprocessDataTest, ProgramLoadsNoLibTorch) {
  ScratchDir dir;
  const std::string command =
      "LD_TRACE_LOADED_OBJECTS=1 '" BRIDGE_PREPROCESS_DATA "' --help > '" + dir / "libraries.txt" + "' 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0);
  const std::string libraries = read_bytes(dir / "libraries.txt");
  ASSERT_THAT(libraries, HasSubstr("libstdc++"));  // the loader did list what it maps
  EXPECT_THAT(libraries, Not(HasSubstr("libtorch")));
  EXPECT_THAT(libraries, Not(HasSubstr("libc10")));
}

TEST(SentenceSplitterTest, SplitsAfterSentenceEndsNotAbbreviations) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_sentences("Hi there. Dr. Who is here!\n\nBye.", false), (V{"Hi there.", "Dr. Who is here!", "Bye."}));
  EXPECT_EQ(split_sentences("Hi there. Dr. Who is here!\n\nBye.", true),
            (V{"Hi there. ", "Dr. Who is here!\n\n", "Bye."}));
  EXPECT_EQ(split_sentences("J. R. R. Tolkien wrote. \"Yes?\" she asked... Then 3.5 e.g. this.", false),
            (V{"J. R. R. Tolkien wrote.", "\"Yes?\" she asked...", "Then 3.5 e.g. this."}));
  EXPECT_EQ(split_sentences("no end here", false), (V{"no end here"}));
  EXPECT_EQ(split_sentences("Wait... what? ok.  ", false), (V{"Wait... what? ok."}));  // lowercase goes on
  EXPECT_EQ(split_sentences("  ", false), V{});
}

// 600 JSON lines (over two batches of four workers) of a few sentences each, with a second key.
std::string corpus(int documents) {
  std::string text;
  for (int i = 0; i < documents; ++i) {
    text += "{\"text\": \"Doc " + std::to_string(i) + " starts. It has " + std::to_string(i % 7) +
            " parts!\\nAnd ends.\", \"title\": \"T" + std::to_string(i) + "\"}\n";
  }
  return text;
}

std::string output_of(const ScratchDir& dir, const std::string& prefix) {
  return read_bytes(dir / (prefix + ".bin")) + "|" + read_bytes(dir / (prefix + ".idx"));
}

TEST(PreprocessDataTest, WorkersAndSequentialPartitionsWriteWhatOneWorkerWrites) {
  ScratchDir dir;
  write_bytes(dir / "corpus.jsonl", corpus(600));
  const std::string base = "--input '" + dir / "corpus.jsonl" + "' --json-keys text title --append-eod ";
  ASSERT_EQ(preprocess(dir, base + "--output-prefix '" + dir / "one" + "'").status, 0);
  ASSERT_EQ(preprocess(dir, base + "--workers 4 --output-prefix '" + dir / "four" + "'").status, 0);
  ASSERT_EQ(preprocess(dir, base + "--workers 4 --partitions 2 --keep-sequential-samples --output-prefix '" +
                                dir / "seq" + "'")
                .status,
            0);
  for (const std::string key : {"text", "title"}) {
    const std::string one = output_of(dir, "one_" + key + "_document");
    ASSERT_GT(one.size(), 600u);
    EXPECT_EQ(output_of(dir, "four_" + key + "_document"), one) << key;
    EXPECT_EQ(output_of(dir, "seq_" + key + "_document"), one) << key;
  }
  EXPECT_EQ(IndexedDataset(dir / "one_title_document").get(599), with_eod(bytes_of("T599")));
}

TEST(PreprocessDataTest, PartitionsDealDocumentsRoundRobinAsMegatron) {
  ScratchDir dir;
  write_bytes(dir / "corpus.jsonl", corpus(10));
  // Megatron's three partitions take lines 0,3,6,9 / 1,4,7 / 2,5,8 and are merged in that order.
  std::string dealt;
  std::vector<std::string> lines;
  std::istringstream in(corpus(10));
  for (std::string line; std::getline(in, line);) lines.push_back(line + "\n");
  for (int partition = 0; partition < 3; ++partition) {
    for (std::size_t i = partition; i < lines.size(); i += 3) dealt += lines[i];
  }
  write_bytes(dir / "dealt.jsonl", dealt);
  ASSERT_EQ(preprocess(dir, "--input '" + dir / "corpus.jsonl" + "' --workers 3 --partitions 3 --output-prefix '" +
                                dir / "parts" + "'")
                .status,
            0);
  ASSERT_EQ(preprocess(dir, "--input '" + dir / "dealt.jsonl" + "' --output-prefix '" + dir / "dealt" + "'").status, 0);
  EXPECT_EQ(output_of(dir, "parts_text_document"), output_of(dir, "dealt_text_document"));
  const ToolRun uneven = preprocess(dir, "--input '" + dir / "corpus.jsonl" + "' --workers 4 --partitions 3 " +
                                             "--output-prefix '" + dir / "x" + "'");
  EXPECT_EQ(uneven.status, 2);
  EXPECT_THAT(uneven.err, HasSubstr("--workers (4) must be a multiple of --partitions (3)"));
}

TEST(PreprocessDataTest, SplitSentencesWritesOneSequencePerSentence) {
  ScratchDir dir;
  write_bytes(dir / "corpus.jsonl", "{\"text\": \"One. Two!\\n\\nThree\"}\n{\"text\": [\"Ab cd. Ef gh.\", \"E.\"]}\n");
  const std::string io = "--input '" + dir / "corpus.jsonl" + "' --split-sentences --append-eod --output-prefix '";
  ASSERT_EQ(preprocess(dir, io + dir / "s" + "'").status, 0);
  IndexedDataset sentences(dir / "s_text_sentence");
  EXPECT_EQ(sentences.document_indices(), (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(sentences.get(0), bytes_of("One."));
  EXPECT_EQ(sentences.get(1), bytes_of("Two!"));
  EXPECT_EQ(sentences.get(2), with_eod(bytes_of("Three")));
  EXPECT_EQ(sentences.get(4), bytes_of("Ef gh."));
  EXPECT_EQ(sentences.get(5), with_eod(bytes_of("E.")));
  ASSERT_EQ(preprocess(dir, io + dir / "k" + "' --keep-newlines").status, 0);
  EXPECT_EQ(IndexedDataset(dir / "k_text_sentence").get(1), bytes_of("Two!\n\n"));
  const ToolRun alone =
      preprocess(dir, "--input '" + dir / "corpus.jsonl" + "' --keep-newlines --output-prefix '" + dir / "n" + "'");
  EXPECT_EQ(alone.status, 2);
  EXPECT_THAT(alone.err, HasSubstr("--keep-newlines applies with --split-sentences only"));
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
  expect_usage_error(io + "--tokenizer-type HuggingFaceTokenizer", "needs --tokenizer-model");
  expect_usage_error(io + "--tokenizer-type NullTokenizer", "needs --vocab-size");
  expect_usage_error(io + "--tokenizer-type SentencePieceTokenizer --tokenizer-model '" + dir / "none.model" + "'",
                     "SentencePieceTokenizer: ");  // cannot load it (or, built without SentencePiece, says so)
  std::filesystem::create_directories(dir / "no_tokenizer");
  expect_usage_error(io + "--tokenizer-type HuggingFaceTokenizer --tokenizer-model '" + dir / "no_tokenizer" + "'",
                     "give the directory of a Hugging Face model");
  // Tokenizer files of the wrong kind are bad input named on the command line: status 2, as docs/failures.md says,
  // for GPT-2's files as for the others, each named as what it is.
  write_bytes(dir / "merges.txt", "#version: 0.2\nh e\n");
  expect_usage_error(io + "--tokenizer-type GPT2BPETokenizer --vocab-file '" + dir / "merges.txt" + "' --merge-file '" +
                         dir / "merges.txt" + "'",
                     dir / "merges.txt" + ": not valid JSON");
  expect_usage_error(io + "--tokenizer-type GPT2BPETokenizer --vocab-file '" + dir / "absent.json" +
                         "' --merge-file '" + dir / "merges.txt" + "'",
                     "cannot open the vocab file " + dir / "absent.json");
  write_bytes(dir / "no_tokenizer/config.json", R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})");
  expect_usage_error(
      io + "--tokenizer-type HuggingFaceTokenizer --tokenizer-model '" + dir / "no_tokenizer" + "/config.json'",
      "config.json is not a tokenizer.json (it has no \"model\"; it is a model's config.json); give "
      "the model's directory");
  expect_usage_error(io + "--tokenizer-type HFTokenizer", "did you mean HuggingFaceTokenizer?");
  // NullTokenizer: the text is the ids.
  write_bytes(dir / "ids.jsonl", "{\"text\": \"5 17 4\"}\n{\"text\": \"2\"}\n");
  ASSERT_EQ(preprocess(dir, "--input '" + dir / "ids.jsonl" + "' --output-prefix '" + dir / "ids" +
                                "' --tokenizer-type NullTokenizer --vocab-size 32 --append-eod")
                .status,
            0);
  const IndexedDataset ids(dir / "ids_text_document");
  EXPECT_EQ(ids.get(0), (std::vector<int64_t>{5, 17, 4, 31}));
  EXPECT_EQ(ids.get(1), (std::vector<int64_t>{2, 31}));
  const ToolRun help = preprocess(dir, "--help");
  EXPECT_EQ(help.status, 0);
  for (const std::string flag :
       {"--input", "--input-format", "--output-prefix", "--json-keys", "--tokenizer-type", "--tokenizer-model",
        "--vocab-size", "HuggingFaceTokenizer", "SentencePieceTokenizer", "NullTokenizer", "--vocab-file",
        "--merge-file", "--append-eod", "--log-interval", "--workers", "--partitions", "--split-sentences",
        "--keep-newlines", "--keep-sequential-samples"}) {
    EXPECT_THAT(read_bytes(dir / "stdout.txt"), HasSubstr(flag));
  }
}

}  // namespace
}  // namespace bridge::training::datasets
