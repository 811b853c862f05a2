// Data parallelism over real process groups: DistributedDataParallel with 2 and 4 ranks against one process on the
// full batch, the tied-embedding reduction of finalize_model_grads across two pipeline stages, and the grad norm
// over a tensor-parallel pair.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/dist/spawn.h"

namespace bridge::testing {
namespace {

constexpr const char* kWorker = BRIDGE_DATA_PARALLEL_WORKER;

void expect_all_ok_and_log(const std::vector<RankResult>& results) {
  expect_all_ok(results);
  std::printf("%s", results[0].output.c_str());  // the differences measured, for the log
}

TEST(DataParallel, TwoRanksFp32WithOverlap) {
  expect_all_ok_and_log(run_ranks(kWorker, {"ddp", "float", "1", "0"}, 2, std::chrono::seconds(120)));
}

TEST(DataParallel, TwoRanksFp32WithoutOverlap) {
  expect_all_ok_and_log(run_ranks(kWorker, {"ddp", "float", "0", "0"}, 2, std::chrono::seconds(120)));
}

TEST(DataParallel, TwoRanksFp64AverageInCollective) {
  expect_all_ok_and_log(run_ranks(kWorker, {"ddp", "double", "1", "1"}, 2, std::chrono::seconds(120)));
}

TEST(DataParallel, FourRanksFp32WithOverlap) {
  expect_all_ok_and_log(run_ranks(kWorker, {"ddp", "float", "1", "0"}, 4, std::chrono::seconds(180)));
}

TEST(DataParallel, FourRanksFp64WithoutOverlap) {
  expect_all_ok_and_log(run_ranks(kWorker, {"ddp", "double", "0", "0"}, 4, std::chrono::seconds(180)));
}

// The distributed optimizer's reduce-scatter: padded buckets, each rank's shard reduced, overlapped with backward.
TEST(DataParallel, TwoRanksReduceScatterForTheDistributedOptimizer) {
  expect_all_ok_and_log(run_ranks(kWorker, {"ddp", "float", "1", "0", "reduce_scatter"}, 2, std::chrono::seconds(120)));
}
TEST(DataParallel, FourRanksReduceScatterWithoutOverlap) {
  expect_all_ok_and_log(
      run_ranks(kWorker, {"ddp", "double", "0", "0", "reduce_scatter"}, 4, std::chrono::seconds(180)));
}

TEST(DataParallel, FinalizeSumsTiedEmbeddingGradsAcrossTwoStages) {
  expect_all_ok_and_log(run_ranks(kWorker, {"finalize"}, 2, std::chrono::seconds(120)));
}

TEST(DataParallel, GradNormOverTensorParallelCountsDuplicatesOnce) {
  expect_all_ok_and_log(run_ranks(kWorker, {"grad_norm"}, 2, std::chrono::seconds(120)));
}

}  // namespace
}  // namespace bridge::testing
