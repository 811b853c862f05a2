// Tensor parallelism over real Gloo groups: 2, 3 and 4 ranks run tensor_parallel_worker, which checks the region
// operators (also over an explicit group with uneven split sizes), the parallel layers and the vocab-parallel cross
// entropy against the same computation done in full; and context-parallel attention over 2 and 4 ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/dist/spawn.h"

namespace bridge::testing {
namespace {

using ::testing::HasSubstr;

constexpr const char* kWorker = BRIDGE_TENSOR_PARALLEL_WORKER;

void expect_ok(int world_size, const std::vector<std::string>& scenarios) {
  const std::vector<RankResult> results = run_ranks(kWorker, scenarios, world_size, std::chrono::seconds(120));
  for (const RankResult& result : results) {
    EXPECT_EQ(result.exit_code, 0) << describe(results);
    for (const std::string& scenario : scenarios) {
      EXPECT_THAT(result.output, HasSubstr(": " + scenario + ": ok")) << describe(results);
    }
  }
}

TEST(TensorParallelDist, Tp2Mappings) { expect_ok(2, {"mappings"}); }
TEST(TensorParallelDist, Tp2MlpMatchesTp1InFp32AndFp64) { expect_ok(2, {"mlp_fp32", "mlp_fp64"}); }
TEST(TensorParallelDist, Tp2StrideSplitsQkvPerHead) { expect_ok(2, {"stride"}); }
TEST(TensorParallelDist, Tp2VocabParallelEmbedding) { expect_ok(2, {"embedding"}); }
TEST(TensorParallelDist, Tp2CrossEntropyThreeAllReducesNoBackwardCommunication) { expect_ok(2, {"cross_entropy"}); }
TEST(TensorParallelDist, Tp2ErrorsNameTheField) { expect_ok(2, {"errors"}); }
TEST(TensorParallelDist, Tp2SequenceParallelRegionsAndLayers) { expect_ok(2, {"sequence_parallel"}); }
// The explicit-group operators with uneven split sizes (MoE token dispatch), on 2 and 3 ranks.
TEST(TensorParallelDist, Tp2UnevenAllToAllGatherAndReduceScatter) { expect_ok(2, {"uneven"}); }
TEST(TensorParallelDist, Tp3UnevenAllToAllGatherAndReduceScatter) { expect_ok(3, {"uneven"}); }
// Context-parallel attention (the world is the cp group): p2p, all_gather and a2a against full causal attention.
TEST(TensorParallelDist, Cp2AttentionMatchesFullCausalAttention) { expect_ok(2, {"cp_attention"}); }
TEST(TensorParallelDist, Cp4AttentionMatchesFullCausalAttention) { expect_ok(4, {"cp_attention"}); }
TEST(TensorParallelDist, Tp4Everything) {
  expect_ok(4, {"mappings", "mlp_fp32", "mlp_fp64", "stride", "embedding", "cross_entropy", "errors",
                "sequence_parallel", "uneven"});
}

}  // namespace
}  // namespace bridge::testing
