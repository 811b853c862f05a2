// Expert parallelism's gradient path over real process groups (Gloo, CPU): DistributedDataParallel reduces expert
// parameters over the expert data-parallel group scaled by 1/|dp|, the grad norm counts every expert once, clipping
// uses that one norm, the parameter norm likewise, and the distributed optimizer sharding experts over the expert
// data-parallel group steps as the plain optimizer and a single process do. Each worker checks against the whole
// model computed directly in every process (see expert_grads_worker.cpp).
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/dist/spawn.h"

namespace bridge::testing {
namespace {

constexpr const char* kWorker = BRIDGE_EXPERT_GRADS_WORKER;

void expect_all_ok_and_log(const std::vector<RankResult>& results) {
  expect_all_ok(results);
  std::printf("%s", results[0].output.c_str());  // the differences measured, for the log
}

// World 2, ep 2: dense dp 2, expert dp 1. An expert's grad is not reduced at all, yet still divided by |dp| = 2.
TEST(ExpertGrads, TwoRanksEp2ReducesExpertsOverExpertDataParallel) {
  expect_all_ok_and_log(run_ranks(kWorker, {"grads", "2"}, 2, std::chrono::seconds(120)));
}

// World 4, ep 2: dense dp 4, expert dp 2 ([0, 2] and [1, 3]): the expert sum over 2 ranks divided by 4.
TEST(ExpertGrads, FourRanksEp2Edp2ReducesExpertsOverExpertDataParallel) {
  expect_all_ok_and_log(run_ranks(kWorker, {"grads", "2"}, 4, std::chrono::seconds(180)));
}

// World 4, cp 2, ep 2: dense dp 2 but dp x cp 4, so the dense grads are reduced over all four ranks (each holds its
// own tokens) and divided by 4; experts fold over dp x cp: ep [0, 1] and [2, 3] (the cp pairs), expert dp [0, 2] and
// [1, 3], the expert sum over 2 ranks divided by 4 as without cp.
TEST(ExpertGrads, FourRanksCp2Ep2ReducesOverDataAndContextParallel) {
  expect_all_ok_and_log(run_ranks(kWorker, {"grads", "2", "2"}, 4, std::chrono::seconds(180)));
}

TEST(ExpertGrads, FourRanksCp2Ep2DistributedOptimizerShardsOverDataAndContextParallel) {
  expect_all_ok_and_log(run_ranks(kWorker, {"distopt", "2", "2"}, 4, std::chrono::seconds(180)));
}

TEST(ExpertGrads, TwoRanksEp2DistributedOptimizerStepsAsOneProcess) {
  expect_all_ok_and_log(run_ranks(kWorker, {"distopt", "2"}, 2, std::chrono::seconds(120)));
}

TEST(ExpertGrads, FourRanksEp2Edp2DistributedOptimizerShardsExpertsOverExpertDataParallel) {
  expect_all_ok_and_log(run_ranks(kWorker, {"distopt", "2"}, 4, std::chrono::seconds(180)));
}

// tp 2 with expert tp 1: the dense tp rank must not decide whether an expert is a duplicate (ranks 0 and 1 hold
// different experts); one reduction, the two model-parallel groups having the same ranks.
TEST(ExpertGrads, FourRanksTp2Ep2Etp1NormsCountEachExpertOnce) {
  expect_all_ok_and_log(run_ranks(kWorker, {"norm", "1"}, 4, std::chrono::seconds(180)));
}

// tp 2 with expert tp 2: an expert bias is replicated over expert tp and counted on expert tp rank 0; the experts'
// squares are summed over the whole world, the dense ones over tp.
TEST(ExpertGrads, FourRanksTp2Ep2Etp2NormsCountEachExpertOnce) {
  expect_all_ok_and_log(run_ranks(kWorker, {"norm", "2"}, 4, std::chrono::seconds(180)));
}

// The MoE router under context parallelism (moe_ep.md 1.4, 2.5): token counts summed over tp x cp (tp x dp x cp for
// global_aux_loss), each cp rank's loss a share of the whole sequences' and the z-loss coefficient divided by
// |tp x cp|; the reported values Megatron's. World 4 with cp 2 (dp 2), and cp 1 (dp 4) as the baseline.
TEST(ExpertGrads, FourRanksCp2RouterLossesAddUpOverTheSequences) {
  expect_all_ok_and_log(run_ranks(kWorker, {"router", "2"}, 4, std::chrono::seconds(180)));
}

TEST(ExpertGrads, FourRanksCp1RouterLossesAreEachReplicas) {
  expect_all_ok_and_log(run_ranks(kWorker, {"router", "1"}, 4, std::chrono::seconds(180)));
}

}  // namespace
}  // namespace bridge::testing
