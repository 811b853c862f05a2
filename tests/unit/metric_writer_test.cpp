// Metric writers: CRC32C against published check values, JSON Lines read back with nlohmann-json, the fanout's
// forwarding and error policy (the reference's fanout-writer tests), and TensorBoard event files read back by the
// tensorboard package's own EventAccumulator (tests/tools/read_tensorboard.py).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "utils/crc32c.h"
#include "utils/fanout_writer.h"
#include "utils/jsonl_writer.h"
#include "utils/tensorboard_writer.h"

namespace bridge::utils {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A fresh directory per test case (ctest runs cases as parallel processes), removed afterwards.
class MetricWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("bridge_metric_writer_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<nlohmann::ordered_json> read_json_lines(const fs::path& path) {
  std::vector<nlohmann::ordered_json> lines;
  for (const auto& line : read_lines(path)) lines.push_back(nlohmann::ordered_json::parse(line));
  return lines;
}

std::vector<std::string> keys_of(const nlohmann::ordered_json& object) {
  std::vector<std::string> keys;
  for (const auto& item : object.items()) keys.push_back(item.key());
  return keys;
}

// ---------------------------------------------------------------------------------------------------------------
// CRC32C

TEST(Crc32c, MatchesPublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the catalogue check value of CRC-32C
  EXPECT_EQ(crc32c(""), 0u);
  // RFC 3720 (iSCSI), appendix B.4.
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
}

TEST(Crc32c, MaskedAsTfRecordMasksIt) {
  // Reference values from tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c.
  EXPECT_EQ(masked_crc32c("123456789"), 0xC78AB0E5u);
  EXPECT_EQ(masked_crc32c(""), 0xA282EAD8u);
}

// ---------------------------------------------------------------------------------------------------------------
// JsonlWriter

TEST_F(MetricWriterTest, JsonlGroupsTheScalarsOfAStepIntoOneLineInTheOrderAdded) {
  const fs::path path = dir_ / "metrics.jsonl";
  JsonlWriter writer(path.string());
  writer.add_scalar("lm loss", 2.31, 10);
  writer.add_scalar("learning-rate", 0.0003, 10);
  writer.add_scalar("train/grad norm", 1.5, 10);
  writer.add_scalar("lm loss", 2.25, 20);
  writer.add_scalar("learning-rate", 0.00029, 20);
  writer.flush();

  const auto lines = read_json_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(keys_of(lines[0]), ElementsAre("step", "lm loss", "learning-rate", "train/grad norm"));
  EXPECT_EQ(lines[0]["step"].get<int64_t>(), 10);
  EXPECT_EQ(lines[0]["lm loss"].get<double>(), 2.31);  // exact: doubles are written to round-trip
  EXPECT_EQ(lines[0]["learning-rate"].get<double>(), 0.0003);
  EXPECT_EQ(lines[0]["train/grad norm"].get<double>(), 1.5);
  EXPECT_THAT(keys_of(lines[1]), ElementsAre("step", "lm loss", "learning-rate"));
  EXPECT_EQ(lines[1]["step"].get<int64_t>(), 20);
  EXPECT_EQ(lines[1]["learning-rate"].get<double>(), 0.00029);
  EXPECT_EQ(read_lines(path)[0], R"({"step":10,"lm loss":2.31,"learning-rate":0.0003,"train/grad norm":1.5})");
}

TEST_F(MetricWriterTest, JsonlWritesALineOnlyOnceItsStepIsComplete) {
  const fs::path path = dir_ / "metrics.jsonl";
  JsonlWriter writer(path.string());
  writer.add_scalar("lm loss", 3.0, 1);
  writer.add_scalar("lm loss", 2.0, 2);  // completes step 1
  writer.add_scalar("lm loss", 1.0, 3);
  writer.add_scalar("grad norm", 0.5, 3);
  writer.add_scalar("lm loss", 0.5, 4);
  writer.add_scalar("lm loss", 0.25, 3);  // steps need not increase: a new line, as after a resume
  writer.flush();
  const auto lines = read_json_lines(path);
  ASSERT_EQ(lines.size(), 5u);
  std::vector<int64_t> steps;
  for (const auto& line : lines) steps.push_back(line["step"].get<int64_t>());
  EXPECT_THAT(steps, ElementsAre(1, 2, 3, 4, 3));
  EXPECT_EQ(lines[2]["grad norm"].get<double>(), 0.5);
  EXPECT_EQ(lines[4]["lm loss"].get<double>(), 0.25);
}

TEST_F(MetricWriterTest, JsonlTagRepeatedInAStepKeepsItsPlaceAndTheLastValue) {
  const fs::path path = dir_ / "metrics.jsonl";
  {
    JsonlWriter writer(path.string());
    writer.add_scalar("a", 1.0, 5);
    writer.add_scalar("b", 2.0, 5);
    writer.add_scalar("a", 3.0, 5);
  }  // the destructor writes the pending line
  const auto lines = read_json_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(keys_of(lines[0]), ElementsAre("step", "a", "b"));
  EXPECT_EQ(lines[0]["a"].get<double>(), 3.0);
}

TEST_F(MetricWriterTest, JsonlWritesNonFiniteValuesAsNull) {
  const fs::path path = dir_ / "metrics.jsonl";
  JsonlWriter writer(path.string());
  writer.add_scalar("nan", kNaN, 7);
  writer.add_scalar("inf", kInf, 7);
  writer.add_scalar("-inf", -kInf, 7);
  writer.add_scalar("finite", -1e300, 7);
  writer.flush();
  const auto lines = read_json_lines(path);  // parse() would throw on a bare NaN or Infinity
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(lines[0]["nan"].is_null());
  EXPECT_TRUE(lines[0]["inf"].is_null());
  EXPECT_TRUE(lines[0]["-inf"].is_null());
  EXPECT_EQ(lines[0]["finite"].get<double>(), -1e300);
}

TEST_F(MetricWriterTest, JsonlEscapesTagsAndCreatesParentDirectories) {
  const fs::path path = dir_ / "a" / "b c" / "metrics.jsonl";
  const std::string tag = "quote \" backslash \\ tab \t slash / unicode \xC3\xA9";
  {
    JsonlWriter writer(path.string());
    writer.add_scalar(tag, 1.25, 0);
    writer.flush();
  }
  const auto lines = read_json_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(keys_of(lines[0]), ElementsAre("step", tag));
}

TEST_F(MetricWriterTest, JsonlAppendsToAnExistingFileSoAResumedRunContinuesIt) {
  const fs::path path = dir_ / "metrics.jsonl";
  {
    JsonlWriter first_run(path.string());
    first_run.add_scalar("lm loss", 4.0, 1);
    first_run.add_scalar("lm loss", 3.0, 2);
    first_run.flush();
  }
  {
    JsonlWriter resumed(path.string());
    resumed.add_scalar("lm loss", 2.0, 3);
    resumed.flush();
  }
  const auto lines = read_json_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["step"].get<int64_t>(), 1);
  EXPECT_EQ(lines[1]["step"].get<int64_t>(), 2);
  EXPECT_EQ(lines[2]["step"].get<int64_t>(), 3);
  EXPECT_EQ(lines[2]["lm loss"].get<double>(), 2.0);
}

TEST_F(MetricWriterTest, JsonlRejectsTheStepTag) {
  JsonlWriter writer((dir_ / "metrics.jsonl").string());
  EXPECT_THROW(writer.add_scalar("step", 1.0, 1), std::invalid_argument);
}

TEST_F(MetricWriterTest, WritersThatCannotCreateTheirFileThrowNamingThePath) {
  fs::create_directories(dir_);
  const fs::path blocker = dir_ / "not_a_directory";
  std::ofstream(blocker) << "a file where a directory should be";
  const std::string jsonl_path = (blocker / "metrics.jsonl").string();
  try {
    JsonlWriter writer(jsonl_path);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("JsonlWriter"));
    EXPECT_THAT(error.what(), HasSubstr(blocker.string()));
  }
  const std::string log_dir = (blocker / "tb").string();
  try {
    TensorBoardWriter writer(log_dir);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("TensorBoardWriter"));
    EXPECT_THAT(error.what(), HasSubstr(log_dir));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// FanoutWriter and build_metric_writer (the reference's _MoeMetricFanoutWriter tests)

// Appends "<name> <call> ..." for every call to a log shared by all recorders, to check the order across writers.
class RecordingWriter : public MetricWriter {
 public:
  RecordingWriter(std::string name, std::vector<std::string>* log, bool throws = false)
      : name_(std::move(name)), log_(log), throws_(throws) {}
  void add_scalar(const std::string& tag, double value, int64_t step) override {
    char text[64];
    std::snprintf(text, sizeof(text), "%.17g", value);
    log_->push_back(name_ + " add " + tag + " " + text + " " + std::to_string(step));
    if (throws_) throw std::runtime_error(name_ + " failed");
  }
  void add_text(const std::string& tag, const std::string& text, int64_t step) override {
    log_->push_back(name_ + " text " + tag + " " + text + " " + std::to_string(step));
    if (throws_) throw std::runtime_error(name_ + " failed");
  }
  void flush() override {
    log_->push_back(name_ + " flush");
    if (throws_) throw std::runtime_error(name_ + " failed");
  }

 private:
  std::string name_;
  std::vector<std::string>* log_;
  bool throws_;
};

TEST(FanoutWriter, BuildReturnsTheOriginalWriterWhenThereAreNoOtherSinks) {
  std::vector<std::string> log;
  auto tensorboard = std::make_shared<RecordingWriter>("tb", &log);
  EXPECT_EQ(build_metric_writer(tensorboard, {}), tensorboard);
  EXPECT_EQ(build_metric_writer(tensorboard, {nullptr, nullptr}), tensorboard);
  EXPECT_EQ(build_metric_writer(nullptr, {}), nullptr);
  EXPECT_EQ(build_metric_writer(nullptr, {nullptr}), nullptr);
}

TEST(FanoutWriter, BuildReturnsAFanoutWhenOnlyOneOtherSinkIsPresent) {
  std::vector<std::string> log;
  auto tensorboard = std::make_shared<RecordingWriter>("tb", &log);
  auto jsonl = std::make_shared<RecordingWriter>("jsonl", &log);
  const auto writer = build_metric_writer(tensorboard, {nullptr, jsonl});
  const auto fanout = std::dynamic_pointer_cast<FanoutWriter>(writer);
  ASSERT_NE(fanout, nullptr);
  EXPECT_THAT(fanout->writers(), ElementsAre(tensorboard, jsonl));
}

TEST(FanoutWriter, AddScalarAndFlushReachAllPresentSinksInOrder) {
  std::vector<std::string> log;
  auto tensorboard = std::make_shared<RecordingWriter>("tb", &log);
  auto a = std::make_shared<RecordingWriter>("a", &log);
  auto b = std::make_shared<RecordingWriter>("b", &log);
  const auto writer = build_metric_writer(tensorboard, {a, nullptr, b});
  writer->add_scalar("lm loss", 0.1, 3);  // the value passes through unchanged (no float rounding)
  writer->flush();
  EXPECT_THAT(log, ElementsAre("tb add lm loss 0.10000000000000001 3", "a add lm loss 0.10000000000000001 3",
                               "b add lm loss 0.10000000000000001 3", "tb flush", "a flush", "b flush"));
}

TEST(FanoutWriter, WorksWhenTheTensorBoardWriterIsNull) {
  std::vector<std::string> log;
  auto jsonl = std::make_shared<RecordingWriter>("jsonl", &log);
  const auto writer = build_metric_writer(nullptr, {jsonl});
  ASSERT_NE(writer, nullptr);
  writer->add_scalar("lm loss", 2.5, 1);
  writer->flush();
  EXPECT_THAT(log, ElementsAre("jsonl add lm loss 2.5 1", "jsonl flush"));
}

TEST(FanoutWriter, PerLayerCallsAreEachForwardedIndividuallyInOrder) {
  std::vector<std::string> log;
  auto tensorboard = std::make_shared<RecordingWriter>("tb", &log);
  auto jsonl = std::make_shared<RecordingWriter>("jsonl", &log);
  const auto writer = build_metric_writer(tensorboard, {jsonl});
  for (int layer = 0; layer < 3; ++layer) {
    writer->add_scalar("moe/load_balancing_loss_layer_" + std::to_string(layer), 0.5 * (layer + 1), 200);
  }
  EXPECT_THAT(
      log, ElementsAre(
               "tb add moe/load_balancing_loss_layer_0 0.5 200", "jsonl add moe/load_balancing_loss_layer_0 0.5 200",
               "tb add moe/load_balancing_loss_layer_1 1 200", "jsonl add moe/load_balancing_loss_layer_1 1 200",
               "tb add moe/load_balancing_loss_layer_2 1.5 200", "jsonl add moe/load_balancing_loss_layer_2 1.5 200"));
}

TEST(FanoutWriter, AWriterThatThrowsDoesNotStopTheOthersAndTheFirstErrorIsRethrown) {
  std::vector<std::string> log;
  FanoutWriter writer({std::make_shared<RecordingWriter>("ok1", &log),
                       std::make_shared<RecordingWriter>("bad1", &log, /*throws=*/true),
                       std::make_shared<RecordingWriter>("ok2", &log),
                       std::make_shared<RecordingWriter>("bad2", &log, /*throws=*/true)});
  try {
    writer.add_scalar("x", 1.0, 1);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "bad1 failed");
  }
  EXPECT_THAT(log, ElementsAre("ok1 add x 1 1", "bad1 add x 1 1", "ok2 add x 1 1", "bad2 add x 1 1"));
  log.clear();
  EXPECT_THROW(writer.flush(), std::runtime_error);
  EXPECT_THAT(log, ElementsAre("ok1 flush", "bad1 flush", "ok2 flush", "bad2 flush"));
}

// ---------------------------------------------------------------------------------------------------------------
// TensorBoardWriter, read back by TensorBoard

struct ScalarEvent {
  std::string tag;
  int64_t step;
  double value;  // as TensorBoard stores it: a float
};

struct TextEvent {
  std::string tag;
  int64_t step;
  std::vector<std::string> text;  // the string tensor's elements
};

const char* const kInstallHint = "run scripts/install_deps.sh, which creates <repo>/.venv with the tensorboard package";

// The scalars of `event_file` as TensorBoard's EventAccumulator reads them, ordered by tag then as written; also
// checks the file version and that wall times fall in [earliest, latest]. The texts go to `texts` when given.
std::vector<ScalarEvent> read_with_tensorboard(const fs::path& event_file, double earliest, double latest,
                                               std::vector<TextEvent>* texts = nullptr) {
  const std::string python = BRIDGE_TOOLS_PYTHON;
  if (!fs::exists(python)) {
    ADD_FAILURE() << "the Python for the TensorBoard reader, " << python << ", does not exist; " << kInstallHint
                  << " (or configure with -DBRIDGE_TOOLS_PYTHON=<python with tensorboard>)";
    return {};
  }
  const fs::path errors = event_file.parent_path() / "reader_stderr.txt";
  const std::string command =
      "'" + python + "' '" + BRIDGE_READ_TENSORBOARD + "' '" + event_file.string() + "' 2>'" + errors.string() + "'";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return {};
  }
  std::string output;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  const int status = ::pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::ifstream in(errors);
    const std::string stderr_text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ADD_FAILURE() << command << " failed (status " << status << "):\n"
                  << stderr_text << "\nIf tensorboard is missing, " << kInstallHint;
    return {};
  }
  const auto json = nlohmann::json::parse(output);
  EXPECT_EQ(json["file_version"], 2.0) << "the first record must carry file_version \"brain.Event:2\"";
  std::vector<ScalarEvent> events;
  for (const auto& item : json["scalars"]) {
    const auto& value = item["value"];
    const double number = value.is_string() ? std::stod(value.get<std::string>()) : value.get<double>();
    const double wall_time = item["wall_time"].get<double>();
    EXPECT_GE(wall_time, earliest);
    EXPECT_LE(wall_time, latest);
    events.push_back({item["tag"].get<std::string>(), item["step"].get<int64_t>(), number});
  }
  for (const auto& item : json["texts"]) {
    if (texts == nullptr) break;
    texts->push_back(
        {item["tag"].get<std::string>(), item["step"].get<int64_t>(), item["text"].get<std::vector<std::string>>()});
  }
  return events;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST_F(MetricWriterTest, TensorBoardNamesItsFileLikeTensorBoardAndCreatesTheDirectory) {
  const fs::path log_dir = dir_ / "runs" / "tb";
  TensorBoardWriter first(log_dir.string());
  TensorBoardWriter second(log_dir.string());
  EXPECT_TRUE(fs::is_directory(log_dir));
  EXPECT_EQ(fs::path(first.file_path()).parent_path(), log_dir);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string name = fs::path(first.file_path()).filename().string();
  EXPECT_THAT(name, MatchesRegex("events\\.out\\.tfevents\\.[0-9]{10}\\." + std::string(host) + "\\." +
                                 std::to_string(::getpid()) + "\\.[0-9]+"));
  const double seconds_in_name = std::stod(name.substr(std::string("events.out.tfevents.").size(), 10));
  EXPECT_NEAR(seconds_in_name, unix_seconds(), 60.0);
  EXPECT_NE(first.file_path(), second.file_path());
  EXPECT_TRUE(fs::exists(second.file_path()));
}

TEST_F(MetricWriterTest, TensorBoardScalarsReadBackByTensorBoardsEventAccumulator) {
  const double start = std::floor(unix_seconds());
  TensorBoardWriter writer((dir_ / "tb").string());

  // Tag -> the (step, value) sequence written, and what TensorBoard should read: the value rounded to a float.
  std::map<std::string, std::vector<std::pair<int64_t, double>>> written;
  auto add = [&](const std::string& tag, int64_t step, double value) {
    writer.add_scalar(tag, value, step);
    written[tag].emplace_back(step, value);
  };
  // Steps increase across all tags: the accumulator drops events that go back in time ("orphaned" by a restart).
  const std::vector<std::string> tags = {"lm loss", "learning-rate", "train/grad norm", "a b/c d/e f"};
  for (int64_t step = 0; step < 250; ++step) {
    add(tags[0], step, 10.0 * std::exp(-0.01 * static_cast<double>(step)) + 0.1);
    add(tags[1], step, 3e-4 * static_cast<double>(step) / 250.0);
    add(tags[2], step, -123456.789 * static_cast<double>(step));
    add(tags[3], step, (step % 2 == 0 ? 1.0 : -1.0) * std::pow(10.0, static_cast<double>(step % 60) - 30.0));
  }
  // Values a float cannot hold, each at its own step: NaN, infinities, overflow to infinity, the largest float, and
  // underflow to zero.
  const std::vector<double> specials = {kNaN, kInf, -kInf, 1e39, -1e39, 3.4028235e38, 1e-46};
  for (size_t i = 0; i < specials.size(); ++i) writer.add_scalar("special", specials[i], 300 + static_cast<int64_t>(i));
  add("large step", int64_t{1} << 40, 7.0);
  writer.flush();  // the file is read while the writer is still open, as TensorBoard reads a live run

  auto events = read_with_tensorboard(writer.file_path(), start, unix_seconds() + 1.0);
  std::vector<ScalarEvent> special_events;
  for (auto it = events.begin(); it != events.end();) {
    if (it->tag == "special") {
      special_events.push_back(*it);
      it = events.erase(it);
    } else {
      ++it;
    }
  }

  size_t total = 0;
  for (const auto& [tag, values] : written) total += values.size();
  ASSERT_EQ(events.size(), total);
  size_t index = 0;
  for (const auto& [tag, values] : written) {  // std::map orders tags as the reader does
    for (const auto& [step, value] : values) {
      const ScalarEvent& event = events[index++];
      ASSERT_EQ(event.tag, tag);
      ASSERT_EQ(event.step, step) << tag;
      EXPECT_EQ(event.value, static_cast<double>(static_cast<float>(value))) << tag << " at step " << step;
    }
  }

  ASSERT_EQ(special_events.size(), specials.size());
  for (size_t i = 0; i < specials.size(); ++i) EXPECT_EQ(special_events[i].step, 300 + static_cast<int64_t>(i));
  EXPECT_TRUE(std::isnan(special_events[0].value));
  EXPECT_EQ(special_events[1].value, kInf);
  EXPECT_EQ(special_events[2].value, -kInf);
  EXPECT_EQ(special_events[3].value, kInf);                                        // 1e39 overflows a float
  EXPECT_EQ(special_events[4].value, -kInf);                                       // -1e39
  EXPECT_EQ(special_events[5].value, static_cast<double>(3.4028234663852886e38));  // rounds to FLT_MAX
  EXPECT_EQ(special_events[6].value, 0.0);                                         // below half the smallest subnormal
}

TEST_F(MetricWriterTest, TensorBoardTextsReadBackByTheTextPlugin) {
  const double start = std::floor(unix_seconds());
  TensorBoardWriter writer((dir_ / "tb").string());
  const std::string multiline =
      "Once upon a time\nthere was \"a quote\", a tab\t and \xc3\xbcnic\xc3\xb8"
      "de";
  writer.add_scalar("lm loss", 2.5, 10);
  writer.add_text("text_generation/prompt_0", multiline, 10);
  writer.add_text("text_generation/prompt_0", "", 20);  // an empty continuation is still a text
  writer.add_text("text_generation/prompt_1", std::string(100000, 'x'), 20);
  // Not UTF-8: a cut character, a stray continuation byte, an overlong '/', a surrogate; each bad byte becomes U+FFFD.
  writer.add_text("text_generation/prompt_2", "cut \xc3|\x80|\xc0\xaf|\xed\xa0\x80|ok \xc3\xa9", 30);
  writer.flush();

  std::vector<TextEvent> texts;
  const auto scalars = read_with_tensorboard(writer.file_path(), start, unix_seconds() + 1.0, &texts);
  ASSERT_EQ(scalars.size(), 1u);  // texts are not read as scalars
  EXPECT_EQ(scalars[0].tag, "lm loss");
  ASSERT_EQ(texts.size(), 4u);
  EXPECT_EQ(texts[0].tag, "text_generation/prompt_0");
  EXPECT_EQ(texts[0].step, 10);
  EXPECT_EQ(texts[0].text, std::vector<std::string>{multiline});
  EXPECT_EQ(texts[1].step, 20);
  EXPECT_EQ(texts[1].text, std::vector<std::string>{""});
  EXPECT_EQ(texts[2].tag, "text_generation/prompt_1");
  EXPECT_EQ(texts[2].text, std::vector<std::string>{std::string(100000, 'x')});
  const std::string r = "\xef\xbf\xbd";  // U+FFFD
  EXPECT_EQ(texts[3].text,
            std::vector<std::string>{"cut " + r + "|" + r + "|" + r + r + "|" + r + r + r + "|ok \xc3\xa9"});
}

TEST_F(MetricWriterTest, JsonlWritesTextsAsStringsInTheStepsLineAndReplacesBrokenUtf8) {
  const fs::path path = dir_ / "metrics.jsonl";
  {
    JsonlWriter writer(path.string());
    writer.add_scalar("lm loss", 2.5, 10);
    writer.add_text("sample", "a \"quote\"\nand \xc3\xbc", 10);
    writer.add_text("cut", "ends inside a character \xc3", 10);
    EXPECT_THROW(writer.add_text("step", "x", 10), std::invalid_argument);
  }
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto json = nlohmann::json::parse(line);
  EXPECT_EQ(json["step"], 10);
  EXPECT_EQ(json["lm loss"], 2.5);
  EXPECT_EQ(json["sample"], "a \"quote\"\nand \xc3\xbc");
  EXPECT_EQ(json["cut"], "ends inside a character \xef\xbf\xbd");  // U+FFFD
  EXPECT_FALSE(std::getline(in, line));
}

TEST(FanoutWriter, AddTextReachesEverySink) {
  std::vector<std::string> log;
  FanoutWriter fanout({std::make_shared<RecordingWriter>("a", &log), std::make_shared<RecordingWriter>("b", &log)});
  fanout.add_text("t", "hello", 3);
  EXPECT_EQ(log, (std::vector<std::string>{"a text t hello 3", "b text t hello 3"}));
}

}  // namespace
}  // namespace bridge::utils
