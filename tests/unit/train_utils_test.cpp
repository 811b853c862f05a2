// train_utils, the training log and the packed statistics in one process, against hand-computed values and the
// reference's test vectors (../shared/reference/megatron_bridge_callbacks.md section 4). The multi-rank behaviour
// (norms across layouts, pipeline maxima, collectives per step) is in tests/dist/stats_dist_test.cpp.
#include "training/utils/train_utils.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <utility>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "training/utils/cuda_memory.h"
#include "training/utils/flop_utils.h"
#include "training/utils/packed_statistics.h"
#include "training/utils/training_log.h"

namespace bridge::training::utils {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

class TrainUtilsOneRank : public ::testing::Test {
 protected:
  void SetUp() override {
    parallel::init_distributed(parallel::LaunchEnv{}, {});
    parallel::initialize_model_parallel(1);
  }
  void TearDown() override { parallel::destroy_distributed(); }
};

std::vector<std::string> names(const StatReport& report) {
  std::vector<std::string> result;
  for (const auto& entry : report) result.push_back(entry.first);
  return result;
}

double value(const StatReport& report, const std::string& name) {
  const std::optional<StatValue> found = find_stat(report, name);
  if (!found) throw std::out_of_range("no " + name + " in the report");
  return to_double(*found);
}

// A chunk with parameters named layer_0..layer_9 of one element each.
std::shared_ptr<torch::nn::Module> numbered_chunk(int count) {
  auto chunk = std::make_shared<torch::nn::Module>();
  for (int i = 0; i < count; ++i) chunk->register_parameter("layer_" + std::to_string(i), torch::zeros({1}));
  return chunk;
}

TEST(ReportThroughput, ReferenceVector) {
  TrainingConfig train;
  train.global_batch_size = 64;
  train.micro_batch_size = 4;
  const std::deque<double> wct = {0.9, 1.7, 2.9, 4.2, 5.9};
  const StatReport report = report_throughput(train, 100, 4096, wct, 5, 1);
  EXPECT_DOUBLE_EQ(value(report, "throughput/batches_per_sec"), 0.8);
  EXPECT_DOUBLE_EQ(value(report, "throughput/tokens_per_sec"), 209715.2);
  EXPECT_DOUBLE_EQ(value(report, "throughput/device/samples_per_sec"), 51.2);
  EXPECT_EQ(std::get<int64_t>(*find_stat(report, "throughput/micro_batch_size")), 4);
  EXPECT_EQ(std::get<int64_t>(*find_stat(report, "throughput/global_batch_size")), 64);
  // Per device divides by the world.
  const StatReport two = report_throughput(train, 100, 4096, wct, 5, 2);
  EXPECT_DOUBLE_EQ(value(two, "throughput/device/tokens_per_sec"), 209715.2 / 2);
  EXPECT_DOUBLE_EQ(value(two, "throughput/samples_per_sec"), 51.2);
}

TEST(ReportThroughput, WindowUsesTheNewestTimestamps) {
  TrainingConfig train;
  train.global_batch_size = 2;
  // Six timestamps, window 3: the last three (10, 12, 14) bracket two steps in 4 s.
  const StatReport report = report_throughput(train, 6, 8, {0.0, 1.0, 5.0, 10.0, 12.0, 14.0}, 3, 1);
  EXPECT_DOUBLE_EQ(value(report, "throughput/batches_per_sec"), 0.5);
  EXPECT_DOUBLE_EQ(value(report, "throughput/tokens_per_sec"), 2 * 2 * 8 / 4.0);
}

TEST(ReportThroughput, EmptyBeforeTheWindowFillsAndWhenNoTimePassed) {
  TrainingConfig train;
  EXPECT_TRUE(report_throughput(train, 3, 16, {1.0, 2.0}, 3, 1).empty());
  EXPECT_TRUE(report_throughput(train, 3, 16, {2.0, 2.0, 2.0}, 3, 1).empty());
  EXPECT_TRUE(report_throughput(train, 3, 16, {3.0, 2.0, 1.0}, 3, 1).empty());
}

TEST(ReportRuntime, FixedTimes) {
  TrainState state;
  state.step = 25;
  state.consumed_train_samples = 800;
  // 50 s for a quarter of 100 steps: 150 s left.
  const StatReport report = report_runtime(state, 100.0, 16, 100, "minutes", 150.0);
  EXPECT_THAT(names(report),
              ElementsAre("time/remaining_estimate", "time/tokens", "time/samples", "time/batches", "time/total"));
  EXPECT_DOUBLE_EQ(value(report, "time/remaining_estimate"), 2.5);
  EXPECT_EQ(std::get<int64_t>(*find_stat(report, "time/tokens")), 12800);
  EXPECT_EQ(std::get<int64_t>(*find_stat(report, "time/samples")), 800);
  EXPECT_EQ(std::get<int64_t>(*find_stat(report, "time/batches")), 25);
  EXPECT_DOUBLE_EQ(value(report, "time/total"), 50.0 / 60.0);
  EXPECT_DOUBLE_EQ(value(report_runtime(state, 0.0, 16, 100, "hours", 7200.0), "time/remaining_estimate"), 6.0);
  EXPECT_DOUBLE_EQ(value(report_runtime(state, 0.0, 16, 100, "days", 86400.0), "time/total"), 1.0);
}

TEST(ReportRuntime, NoEstimateBeforeTheFirstStepAndUnitsChecked) {
  TrainState state;
  EXPECT_FALSE(find_stat(report_runtime(state, 0.0, 16, 100, "seconds", 5.0), "time/remaining_estimate"));
  EXPECT_THAT([&] { report_runtime(state, 0.0, 16, 100, "weeks", 5.0); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("logging.runtime_time_unit")));
}

TEST(ReportMemory, CpuResidentSetFromTheOs) {
  if (cuda_memory_stats_available()) GTEST_SKIP() << "a GPU is visible: report_memory reads the CUDA allocator";
  const StatReport report = report_memory();
  ASSERT_THAT(names(report), ElementsAre("mem-resident-gigabytes", "mem-max-resident-gigabytes"));
  EXPECT_GT(value(report, "mem-resident-gigabytes"), 0.0);
  EXPECT_GE(value(report, "mem-max-resident-gigabytes"), value(report, "mem-resident-gigabytes"));
  // A bigger allocation raises the resident set by about its size (after touching every page).
  const double before = value(report_memory(), "mem-resident-gigabytes");
  std::vector<char> block(300'000'000, 1);
  const double after = value(report_memory(), "mem-resident-gigabytes");
  // (ASan's shadow memory adds an eighth.)
  EXPECT_GE(after - before, 0.28) << static_cast<int>(block[12345]);
  EXPECT_LE(after - before, 0.42);
}

// Runs only where a GPU is visible: the CUDA allocator's statistics under Megatron-Bridge's ten keys.
TEST(ReportMemory, CudaAllocatorStatistics) {
  if (!cuda_memory_stats_available()) GTEST_SKIP() << "no GPU visible";
  torch::Tensor block = torch::empty({64, 1024, 1024}, torch::TensorOptions().device(torch::kCUDA));  // 256 MiB
  const StatReport report = report_memory();
  ASSERT_THAT(names(report), ElementsAre("mem-allocated-gigabytes", "mem-active-gigabytes", "mem-inactive-gigabytes",
                                         "mem-reserved-gigabytes", "mem-max-allocated-gigabytes",
                                         "mem-max-active-gigabytes", "mem-max-inactive-gigabytes",
                                         "mem-max-reserved-gigabytes", "mem-alloc-retires", "mem-allocated-count"));
  EXPECT_GE(value(report, "mem-allocated-gigabytes"), 0.268);
  EXPECT_GE(value(report, "mem-reserved-gigabytes"), value(report, "mem-allocated-gigabytes"));
  EXPECT_GE(value(report, "mem-max-allocated-gigabytes"), value(report, "mem-allocated-gigabytes"));
  EXPECT_GE(value(report, "mem-allocated-count"), 1.0);
  block.reset();
}

TEST(ReportMemory, KeysSelectAndRename) {
  const StatReport report = report_memory(MemoryKeys{{"resident_bytes.peak", "peak-bytes"}, {"missing", "gone"}});
  EXPECT_THAT(names(report), ElementsAre("peak-gigabytes"));
  EXPECT_EQ(default_memory_keys().size(), 10U);
  EXPECT_EQ(default_memory_keys()[8].second, "mem-alloc-retires");
}

TEST_F(TrainUtilsOneRank, ReduceMaxMemoryIsTheIdentityWithoutAPipeline) {
  const StatReport report = {{"mem-allocated-count", int64_t{7}}, {"mem-reserved-gigabytes", 1.5}};
  EXPECT_EQ(reduce_max_memory_across_pp_group(report, nullptr), report);
  EXPECT_EQ(reduce_max_memory_across_pp_group(report, &parallel::get_pipeline_model_parallel_group()), report);
  EXPECT_TRUE(reduce_max_memory_across_pp_group({}, &parallel::get_pipeline_model_parallel_group()).empty());
}

TEST_F(TrainUtilsOneRank, SmallCollectives) {
  parallel::ProcessGroup& mp = parallel::get_model_parallel_group();
  EXPECT_EQ(reduce_max_stat_across_model_parallel_group(2.5, mp), 2.5);
  EXPECT_EQ(reduce_max_stat_across_model_parallel_group(std::nullopt, mp), std::nullopt);
  EXPECT_TRUE(logical_and_across_model_parallel_group(true, mp));
  EXPECT_FALSE(logical_and_across_model_parallel_group(false, mp));
}

TEST_F(TrainUtilsOneRank, ParamsNormSkipsTheSharedCopyAndMeasuresHalfPrecisionInFp32) {
  auto chunk = std::make_shared<torch::nn::Module>();
  chunk->register_parameter("a", torch::full({4}, 1.0));  // norm^2 4
  chunk->register_parameter("b", torch::full({9}, 2.0));  // norm^2 36
  auto shared = chunk->register_parameter("tied", torch::full({100}, 5.0));
  parallel::tensor_parallel::ParamAttributes attributes;
  attributes.shared_embedding = true;
  parallel::tensor_parallel::set_param_attributes(shared, attributes);
  auto half = std::make_shared<torch::nn::Module>();
  half->register_parameter("h", torch::full({16}, 0.5, torch::kBFloat16));  // norm^2 4
  const ModelChunks model = {chunk, half};
  EXPECT_DOUBLE_EQ(local_params_norm_squared(model), 44.0);
  EXPECT_DOUBLE_EQ(calc_params_l2_norm(model), std::sqrt(44.0));
  EXPECT_DOUBLE_EQ(calc_params_l2_norm(model, /*force_create_fp32_copy=*/true), std::sqrt(44.0));
  chunk->named_parameters()["a"].data().fill_(std::sqrt(0.1));  // not exact in fp32: measured as stored
  EXPECT_NEAR(calc_params_l2_norm(model), std::sqrt(40.0 + 0.4), 1e-6);
}

TEST_F(TrainUtilsOneRank, GradNormsPerParameterAndGlobal) {
  // The reference's vector: grads 0..9. Per name exact; global is the norm of all of them, sqrt(285) (the reference
  // returns 74.92 by re-accumulating its own running "global").
  auto chunk = numbered_chunk(10);
  int i = 0;
  for (auto& param : chunk->parameters()) param.mutable_grad() = torch::full({1}, static_cast<double>(i++));
  const StatReport report = report_l2_norm_grad({chunk});
  EXPECT_DOUBLE_EQ(value(report, "l2_norm/grad/layer_2"), 2.0);
  EXPECT_DOUBLE_EQ(value(report, "l2_norm/grad/layer_9"), 9.0);
  EXPECT_DOUBLE_EQ(value(report, "l2_norm/grad/global"), std::sqrt(285.0));
  EXPECT_EQ(names(report).back(), "l2_norm/grad/global");
  EXPECT_EQ(report.size(), 11U);
}

TEST(FlopUtils, MegatronFormulaByHand) {
  models::GPTConfig config;
  config.num_layers = 2;
  config.hidden_size = 64;
  config.num_attention_heads = 4;
  config.ffn_hidden_size = 256;
  config.vocab_size = 200;  // padded to 256 at tp 1, 512 at tp 4 (multiples of 128 x tp)
  config.seq_length = 64;
  // 12 b s L h^2 ((1 + 1 + s/h) + f/h + V/(2 L h)) = 12*8*64*2*64^2 * (3 + 4 + 1)
  EXPECT_DOUBLE_EQ(num_floating_point_operations(config, 8, 1), 12.0 * 8 * 64 * 2 * 64 * 64 * 8);
  EXPECT_DOUBLE_EQ(num_floating_point_operations(config, 8, 4), 12.0 * 8 * 64 * 2 * 64 * 64 * 9);
}

// Megatron's MoE terms: an MoE layer counts its k routed experts and its shared experts (the active parameters), a
// dense layer its MLP. Layer 0 MoE with k = 2 experts of 64 and a shared 64 (3 x 64 / h = 3), layer 1
// dense with 256 (f / h = 4): the mean MLP term is (3 + 4) / 2.
TEST(FlopUtils, MoeLayersCountTheirActiveExperts) {
  models::GPTConfig config;
  config.num_layers = 2;
  config.hidden_size = 64;
  config.num_attention_heads = 4;
  config.ffn_hidden_size = 256;
  config.vocab_size = 200;
  config.seq_length = 64;
  config.num_moe_experts = 8;
  config.moe_ffn_hidden_size = 64;
  config.moe_router_topk = 2;
  config.moe_shared_expert_intermediate_size = 64;
  config.moe_layer_freq.pattern = {1, 0};
  // 12 b s L h^2 ((1 + 1 + s/h) + (3 + 4) / 2 + V/(2 L h)) = 12*8*64*2*64^2 * (3 + 3.5 + 1)
  EXPECT_DOUBLE_EQ(num_floating_point_operations(config, 8, 1), 12.0 * 8 * 64 * 2 * 64 * 64 * 7.5);
}

// Megatron's terms for grouped-query attention (num_query_groups / num_attention_heads key/value projections) and a
// gated MLP (three GEMMs of f instead of two: x 3/2).
TEST(FlopUtils, GroupedQueriesAndGatedMlpByHand) {
  models::GPTConfig config;
  config.num_layers = 2;
  config.hidden_size = 64;
  config.num_attention_heads = 4;
  config.num_query_groups = 2;
  config.gated_linear_unit = true;
  config.ffn_hidden_size = 256;
  config.vocab_size = 200;
  config.seq_length = 64;
  // (1 + 2/4 + 1) + 4 * 3/2 + 256 / (2 * 2 * 64) = 2.5 + 6 + 1
  EXPECT_DOUBLE_EQ(num_floating_point_operations(config, 8, 1), 12.0 * 8 * 64 * 2 * 64 * 64 * 9.5);
}

LossDict losses(double lm) { return {{"lm loss", torch::tensor(lm)}}; }

// As parsers of Megatron's log read it: split on '|', the "lm loss" field's value is a float and nothing else.
double logged_loss(const std::string& line) {
  std::istringstream fields(line);
  for (std::string field; std::getline(fields, field, '|');) {
    const std::size_t colon = field.find(':');
    if (colon == std::string::npos || field.substr(0, colon).find("lm loss") == std::string::npos) continue;
    const std::string value = field.substr(colon + 1);
    std::size_t parsed = 0;
    const double loss = std::stod(value, &parsed);
    EXPECT_EQ(value.find_first_not_of(' ', parsed), std::string::npos) << "'" << value << "' is not only a float";
    return loss;
  }
  ADD_FAILURE() << "no lm loss field in " << line;
  return std::nan("");
}

TEST(TrainingLog, MegatronLineWithEveryField) {
  TotalLossDict total;
  accumulate_losses(total, losses(2.0), false);
  accumulate_losses(total, losses(3.0), false);
  LogLineFields fields;
  fields.timestamp = "2026-11-22 10:00:00";
  fields.iteration = 10;
  fields.train_iters = 100;
  fields.consumed_samples = 320;
  fields.elapsed_ms_per_iteration = 812.34;
  fields.learning_rate = 3e-4;
  fields.global_batch_size = 32;
  fields.grad_norm = 1.2346;
  fields.extra = {"custom: 1"};
  const std::string averaged = format_log_line(fields, total);
  EXPECT_EQ(averaged,
            " [2026-11-22 10:00:00] iteration       10/     100 | consumed samples:          320 | elapsed time per "
            "iteration (ms): 812.3 | learning rate: 3.000000E-04 | global batch size:    32 | losses averaged over: "
            "2 steps | lm loss: 2.500000E+00 | loss scale: 1.0 | grad norm: 1.235 | custom: 1 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |");
  // Printing reset the sums and the counters.
  EXPECT_EQ(total.advanced_iterations, 0);
  EXPECT_DOUBLE_EQ(logged_loss(averaged), 2.5) << averaged;
  EXPECT_DOUBLE_EQ(total.loss_sums.at(0).second, 0.0);

  fields.skipped_samples = 5;
  fields.tflops_per_device = 12.34;
  fields.num_zeros_in_grad = 17;
  fields.params_norm = 3.0;
  fields.extra.clear();
  fields.elapsed_seconds = 12.4;
  fields.eta_seconds = 3723.4;
  accumulate_losses(total, losses(1.0), false);
  const std::string line = format_log_line(fields, total);
  EXPECT_THAT(line, HasSubstr("| consumed samples:          320 | skipped samples:            5 | elapsed"));
  // The time since the start and the time left, as durations, before Megatron's throughput.
  EXPECT_THAT(line, HasSubstr("(ms): 812.3 | elapsed: 0:00:12 | ETA: 1:02:03 | throughput per GPU (TFLOP/s/GPU): "
                              "12.3 | learning rate:"));
  EXPECT_THAT(line, HasSubstr("| global batch size:    32 | lm loss: 1.000000E+00 |"))
      << "one step: its own loss, no mean to name";
  EXPECT_DOUBLE_EQ(logged_loss(line), 1.0) << line;
  EXPECT_THAT(line, HasSubstr("| grad norm: 1.235 | num zeros: 17 | params norm: 3.000 | number of skipped"));
}

// A callback may keep a copy of the record; completing the copy must not run the loop's pending functions again.
TEST(TrainingLog, ACopiedLogRecordCarriesItsFieldsButNotThePendingFunctions) {
  LogRecord record;
  record.iteration = 3;
  record.metrics["tokens/s"] = 10.0;
  int runs = 0;
  record.when_complete([&](const LogRecord& completed) {
    ++runs;
    EXPECT_EQ(completed.iteration, 3);
  });
  LogRecord copy = record;
  LogRecord assigned;
  assigned = record;
  EXPECT_EQ(copy.metrics, record.metrics);
  copy.complete();
  assigned.complete();
  EXPECT_EQ(runs, 0);
  record.complete();
  record.complete();
  EXPECT_EQ(runs, 1);
  LogRecord moved_from;
  moved_from.when_complete([&](const LogRecord&) { ++runs; });
  LogRecord moved = std::move(moved_from);
  moved.complete();
  EXPECT_EQ(runs, 2);
}

TEST(TrainingLog, SkippedStepsCountNanOnlyWhenSkipped) {
  TotalLossDict total;
  accumulate_losses(total, losses(std::nan("")), /*skipped_iter=*/true);  // skipped and NaN
  accumulate_losses(total, losses(1.0), /*skipped_iter=*/true);           // skipped, finite
  accumulate_losses(total, losses(INFINITY), /*skipped_iter=*/false);     // NaN-like but not skipped: summed
  EXPECT_EQ(total.advanced_iterations, 1);
  EXPECT_EQ(total.skipped_iterations, 2);
  EXPECT_EQ(total.nan_iterations, 1);
  accumulate_losses(total, losses(-3.0), false);
  LogLineFields fields;
  const std::string line = format_log_line(fields, total);
  // inf + (-3) over 2 advanced steps is printed; a negative average would not be.
  EXPECT_THAT(line, HasSubstr("lm loss: INF"));
  EXPECT_THAT(line, HasSubstr("number of skipped iterations:   2 | number of nan iterations:   1 |"));
  accumulate_losses(total, losses(-3.0), false);
  EXPECT_THAT(format_log_line(fields, total), ::testing::Not(HasSubstr("lm loss")));
}

TEST_F(TrainUtilsOneRank, PackedStatisticsReduceEachEntry) {
  PackedStatistics stats;
  parallel::ProcessGroup& world = parallel::get_world_group();
  const auto sum = stats.add("sum", parallel::ReduceOp::kSum, parallel::get_model_parallel_group(), {1.5, -2.0});
  const auto max = stats.add("max", parallel::ReduceOp::kMax, parallel::get_pipeline_model_parallel_group(), {7.0});
  const auto empty = stats.add("none", parallel::ReduceOp::kMin, world, {});
  EXPECT_EQ(stats.packed_size(), 4U);
  stats.exchange(world);
  EXPECT_THAT(stats.values(sum), ElementsAre(1.5, -2.0));
  EXPECT_DOUBLE_EQ(stats.scalar(max), 7.0);
  EXPECT_TRUE(stats.values(empty).empty());
  EXPECT_THROW(stats.scalar(sum), std::logic_error);
  EXPECT_THROW(stats.add("late", parallel::ReduceOp::kSum, world, {1.0}), std::logic_error);
  EXPECT_THROW(stats.exchange(world), std::logic_error);
}

}  // namespace
}  // namespace bridge::training::utils
