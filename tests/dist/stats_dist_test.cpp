// Statistics across parallel layouts, over real ranks: every statistic pretrain() writes (losses, learning rate,
// grad and params norms, every parameter's grad norm) equals the single-process run's at tp=2, pp=2 (plain and
// interleaved) and dp=2; the standalone train_utils collectives agree with what the loop wrote; TensorBoard's own
// reader reads the event file back; the console line has Megatron's fields; and a log step costs one collective.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "tests/dist/spawn.h"

namespace {

namespace fs = std::filesystem;
using bridge::testing::describe;
using bridge::testing::expect_all_ok;
using bridge::testing::RankResult;
using bridge::testing::run_ranks;
using ::testing::HasSubstr;

constexpr const char* kWorker = BRIDGE_STATS_WORKER;
using Metrics = std::map<int64_t, std::map<std::string, double>>;  // step -> name -> value

fs::path fresh_directory(const std::string& name) {
  const fs::path directory = fs::temp_directory_path() / ("bridge_stats_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(directory);
  fs::create_directories(directory);
  return directory;
}

Metrics read_jsonl(const fs::path& path) {
  Metrics metrics;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json object = nlohmann::json::parse(line);
    auto& step = metrics[object.at("step").get<int64_t>()];
    for (const auto& [key, value] : object.items()) {
      if (key != "step" && value.is_number()) step[key] = value.get<double>();
    }
  }
  return metrics;
}

std::vector<RankResult> run_stats(const fs::path& directory, int world, int tp, int pp, int vpp,
                                  const std::string& optimizer = "plain") {
  return run_ranks(
      kWorker, {"stats", directory.string(), std::to_string(tp), std::to_string(pp), std::to_string(vpp), optimizer},
      world, std::chrono::seconds(180));
}

double relative(double a, double b) { return std::fabs(a - b) / std::max({std::fabs(a), std::fabs(b), 1e-30}); }

// The single-process run, shared by the tests of this binary (each test is its own process, so run once there).
const Metrics& reference_metrics() {
  static const Metrics metrics = [] {
    const fs::path directory = fresh_directory("reference");
    const auto results = run_stats(directory, 1, 1, 1, 0);
    expect_all_ok(results, "stats: ok");
    Metrics read = read_jsonl(directory / "metrics.jsonl");
    fs::remove_all(directory);
    return read;
  }();
  return metrics;
}

void expect_layout_matches_reference(const std::string& name, int world, int tp, int pp, int vpp,
                                     const std::string& optimizer = "plain") {
  const Metrics& reference = reference_metrics();
  ASSERT_EQ(reference.size(), 3U) << "3 steps, one JSONL line each";
  const fs::path directory = fresh_directory(name);
  const auto results = run_stats(directory, world, tp, pp, vpp, optimizer);
  expect_all_ok(results, "stats: ok");
  const Metrics layout = read_jsonl(directory / "metrics.jsonl");
  ASSERT_EQ(layout.size(), 3U) << describe(results);

  double worst = 0.0;
  std::string worst_name;
  for (const auto& [step, expected] : reference) {
    const auto& actual = layout.at(step);
    int compared = 0;
    for (const auto& [key, value] : expected) {
      const bool layout_independent = key == "lm loss" || key == "grad-norm" || key == "params-norm" ||
                                      key == "learning-rate" || key == "samples vs steps" || key == "batch-size" ||
                                      key.rfind("l2_norm/grad/", 0) == 0 || key.rfind("lm loss ", 0) == 0;
      if (!layout_independent) continue;
      ASSERT_EQ(actual.count(key), 1U) << name << " step " << step << " lacks " << key;
      const double difference = relative(actual.at(key), value);
      if (difference > worst) {
        worst = difference;
        worst_name = key;
      }
      EXPECT_LT(difference, 2e-5) << name << " step " << step << " " << key << ": " << actual.at(key) << " vs "
                                  << value;
      ++compared;
    }
    // 4 layers x 12 + embeddings 2 + final norm 2 per-parameter norms, the global one, and the 6 scalars; the
    // validation loss and ppl at step 2, and at step 3 (after training) the test's too.
    const int evaluated = step == 2 ? 2 : step == 3 ? 4 : 0;
    EXPECT_EQ(compared, 4 * 12 + 4 + 1 + 6 + evaluated) << name << " step " << step;
    EXPECT_EQ(actual.at("world-size"), world);
    EXPECT_GT(actual.at("memory/mem-resident-gigabytes"), 0.0);
    EXPECT_GE(actual.at("memory/mem-max-resident-gigabytes"), actual.at("memory/mem-resident-gigabytes"));
    EXPECT_EQ(actual.at("time/batches"), step);
    if (step >= 2) {
      EXPECT_GT(actual.at("throughput/device/tokens_per_sec"), 0.0) << name;
    }
  }
  std::printf("%s: largest relative difference to one process %.2e (%s)\n", name.c_str(), worst, worst_name.c_str());

  // The standalone collectives, called by a callback after each step, agree with what the loop wrote.
  std::ifstream standalone(directory / "standalone.txt");
  std::string line;
  int checked = 0;
  while (std::getline(standalone, line)) {
    std::istringstream fields(line);
    int64_t step = 0;
    std::string key;
    double value = 0.0;
    fields >> step >> key >> value;
    const std::string written = key == "reduced-grad-norm" ? "grad-norm" : key;
    ASSERT_EQ(layout.at(step).count(written), 1U) << key;
    EXPECT_LT(relative(layout.at(step).at(written), value), 1e-9) << name << " step " << step << " " << key;
    ++checked;
  }
  EXPECT_EQ(checked, 3 * (2 + 4 * 12 + 4 + 1)) << name;

  // Megatron's console line, on the last rank only.
  const std::string& last = results.back().output;
  EXPECT_THAT(last, HasSubstr("] iteration        3/       3 | consumed samples:           12 | elapsed time per "
                              "iteration (ms): "));
  // One timestamp per line: Megatron's own on the training log line, none from the logger's prefix.
  std::istringstream lines(last);
  int training_lines = 0;
  for (std::string printed; std::getline(lines, printed);) {
    if (printed.find("] iteration ") == std::string::npos) continue;
    ++training_lines;
    EXPECT_TRUE(std::regex_search(
        printed, std::regex(R"(^\[rank \d+/\d+\] \[info\]  \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration )")))
        << printed;
  }
  EXPECT_GT(training_lines, 0) << last;
  EXPECT_THAT(last, HasSubstr(" | throughput per GPU (TFLOP/s/GPU): "));
  EXPECT_THAT(last, HasSubstr(" | global batch size:     4 | lm loss: "));
  EXPECT_THAT(last, HasSubstr(" | loss scale: 1.0 | grad norm: "));
  EXPECT_THAT(last, HasSubstr(" | number of skipped iterations:   0 | number of nan iterations:   0 |"));
  // Megatron's evaluation blocks: during training, then after it on the validation and the test set.
  EXPECT_THAT(last, HasSubstr(" validation loss at iteration 2 | lm loss value: "));
  EXPECT_THAT(last, HasSubstr(" validation loss at iteration 3 on validation set | lm loss value: "));
  EXPECT_THAT(last, HasSubstr(" validation loss at iteration 3 on test set | lm loss value: "));
  EXPECT_THAT(last, HasSubstr("[info] ----------"));
  if (world > 1) {
    EXPECT_THAT(results.front().output, ::testing::Not(HasSubstr("] iteration "))) << "rank 0 printed";
  }
  fs::remove_all(directory);
}

TEST(StatsAcrossLayouts, TensorParallel2) { expect_layout_matches_reference("tp2", 2, 2, 1, 0); }
TEST(StatsAcrossLayouts, PipelineParallel2) { expect_layout_matches_reference("pp2", 2, 1, 2, 0); }
TEST(StatsAcrossLayouts, InterleavedPipeline2x2Chunks) { expect_layout_matches_reference("pp2vpp2", 2, 1, 2, 2); }
TEST(StatsAcrossLayouts, DataParallel2) { expect_layout_matches_reference("dp2", 2, 1, 1, 0); }
// The distributed optimizer reduce-scatters the gradients: each per-parameter norm is summed from the ranks' pieces.
TEST(StatsAcrossLayouts, Pp2Dp2DistributedOptimizer) {
  expect_layout_matches_reference("pp2dp2_distopt", 4, 1, 2, 0, "distopt");
}

TEST(StatsTensorBoard, TheRealReaderReadsWhatTheJsonlHas) {
  const fs::path directory = fresh_directory("tensorboard");
  expect_all_ok(run_stats(directory, 1, 1, 1, 0), "stats: ok");
  const Metrics jsonl = read_jsonl(directory / "metrics.jsonl");
  const std::string command = std::string(BRIDGE_TOOLS_PYTHON) + " " + BRIDGE_READ_TENSORBOARD + " " +
                              (directory / "tensorboard").string() + " 2>&1";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  ASSERT_EQ(::pclose(pipe), 0) << output << "\n(run scripts/install_deps.sh, which creates .venv with tensorboard)";
  const nlohmann::json read = nlohmann::json::parse(output);
  int matched = 0, vs_samples = 0;
  for (const auto& scalar : read.at("scalars")) {
    const std::string tag = scalar.at("tag").get<std::string>();
    const int64_t step = scalar.at("step").get<int64_t>();
    if (tag.size() > 11 && tag.compare(tag.size() - 11, 11, " vs samples") == 0) {
      EXPECT_EQ(step % 4, 0) << tag << ": steps of 'vs samples' curves count samples (4 per step)";
      ++vs_samples;
      continue;
    }
    ASSERT_EQ(jsonl.at(step).count(tag), 1U) << tag << " at step " << step << " is not in the JSONL";
    EXPECT_FLOAT_EQ(scalar.at("value").get<double>(), static_cast<float>(jsonl.at(step).at(tag))) << tag;
    ++matched;
  }
  std::size_t written = 0;
  for (const auto& step : jsonl) written += step.second.size();
  EXPECT_EQ(static_cast<std::size_t>(matched), written) << "every JSONL metric is in the event file";
  EXPECT_EQ(vs_samples, 3 * 7 + 2 * 2 + 2) << "lm loss, learning-rate, batch-size, loss-scale, world-size, "
                                              "grad-norm, params-norm at 3 steps; lm loss validation and its ppl at "
                                              "2; lm loss test and its ppl at 1";

  // Megatron-Bridge's names and units, and the evaluations' losses with their perplexity.
  const auto& last = jsonl.rbegin()->second;
  EXPECT_EQ(jsonl.rbegin()->first, 3);
  for (const char* tag : {"lm loss validation", "lm loss test"}) {
    ASSERT_EQ(last.count(tag), 1U) << tag;
    EXPECT_NEAR(last.at(std::string(tag) + " ppl"), std::exp(last.at(tag)), 1e-9 * std::exp(last.at(tag))) << tag;
    EXPECT_GT(last.at(tag), 4.0) << tag << ": about ln(128) from random weights";
  }
  EXPECT_EQ(jsonl.at(2).count("lm loss validation"), 1U) << "the evaluation at eval_interval";
  EXPECT_EQ(jsonl.at(1).count("lm loss validation"), 0U);
  for (const auto& [step, metrics] : jsonl) {
    EXPECT_GT(metrics.at("iteration-time"), 0.0) << "step " << step;
    EXPECT_LT(metrics.at("iteration-time"), 60.0) << "seconds, not milliseconds";
    EXPECT_GT(metrics.at("throughput/tflops/device"), 0.0);
    EXPECT_DOUBLE_EQ(metrics.at("throughput/tflops"), metrics.at("throughput/tflops/device")) << "one rank";
    EXPECT_EQ(metrics.count("iteration-time-ms") + metrics.count("throughput"), 0U) << "the old names";
  }

  fs::remove_all(directory);
}

std::vector<RankResult> run_count(int log_interval, bool with_on_log) {
  return run_ranks(kWorker, {"count", std::to_string(log_interval), with_on_log ? "1" : "0"}, 2,
                   std::chrono::seconds(180));
}

TEST(StatsCollectives, ALogStepCostsOneWorldCollectiveAndNoModelParallelOne) {
  const auto results = run_count(1, false);
  expect_all_ok(results, "count: ok");
  EXPECT_THAT(results[0].output, HasSubstr("step 3 world 1 mp ")) << describe(results);
  std::printf("%s", results[0].output.c_str());  // the counts per step, for the record
}

TEST(StatsCollectives, OnLogListenersAddTheStepBoundaryAgreement) { expect_all_ok(run_count(2, true), "count: ok"); }

// After a log step's collective, requests made in on_log still take effect at that step; requests made before it
// travel in it.
std::vector<RankResult> run_control(const std::string& mode, const fs::path& directory) {
  return run_ranks(kWorker, {"control", mode, directory.string()}, 2, std::chrono::seconds(180));
}

TEST(StatsControl, AStopAskedInOnLogStopsEveryRankAtThatStep) {
  const auto results = run_control("on_log_stop", fresh_directory("on_log_stop"));
  expect_all_ok(results, "control: ok");
  for (const RankResult& result : results)
    EXPECT_THAT(result.output, HasSubstr("ended at step 4")) << describe(results);
}

TEST(StatsControl, AStopAskedBeforeALogStepTravelsInItsCollective) {
  const auto results = run_control("step_end_stop", fresh_directory("step_end_stop"));
  expect_all_ok(results, "control: ok");
  for (const RankResult& result : results)
    EXPECT_THAT(result.output, HasSubstr("ended at step 4")) << describe(results);
  EXPECT_THAT(results[0].output, HasSubstr("callback 'stopper' asked to stop during on_train_step_end"))
      << describe(results);
}

TEST(StatsControl, ASaveAskedInOnLogSavesAtThatStep) {
  const fs::path directory = fresh_directory("on_log_save");
  const auto results = run_control("on_log_save", directory);
  expect_all_ok(results, "control: ok");
  EXPECT_TRUE(fs::exists(directory / "iter_0000002")) << describe(results);
  EXPECT_TRUE(fs::exists(directory / "iter_0000006")) << describe(results);
  EXPECT_FALSE(fs::exists(directory / "iter_0000004")) << describe(results);
  fs::remove_all(directory);
}

}  // namespace
