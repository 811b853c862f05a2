// Multi-process pipeline schedules: 1F1B on two and four ranks and the interleaved schedule on two and four ranks,
// each checked by pipeline_worker against the whole model run in one process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/dist/spawn.h"

namespace bridge::testing {
namespace {

constexpr const char* kWorker = BRIDGE_PIPELINE_WORKER;

TEST(PipelineMultiProcess, OneForwardOneBackwardTwoStages) {
  expect_all_ok(run_ranks(kWorker, {"1f1b"}, 2, std::chrono::seconds(120)));
}

TEST(PipelineMultiProcess, OneForwardOneBackwardFourStages) {
  expect_all_ok(run_ranks(kWorker, {"1f1b"}, 4, std::chrono::seconds(120)));
}

TEST(PipelineMultiProcess, InterleavedTwoStages) {
  expect_all_ok(run_ranks(kWorker, {"interleaved"}, 2, std::chrono::seconds(120)));
}

TEST(PipelineMultiProcess, InterleavedFourStages) {
  expect_all_ok(run_ranks(kWorker, {"interleaved"}, 4, std::chrono::seconds(120)));
}

}  // namespace
}  // namespace bridge::testing
