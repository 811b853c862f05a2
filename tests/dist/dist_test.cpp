// Real multi-process tests: 2, 4 and 8 ranks on this machine check every collective on every group, and a rank that
// dies makes the others fail with a clear error within the timeout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/dist/spawn.h"
#include "utils/net.h"

namespace bridge::testing {
namespace {

using ::testing::HasSubstr;

constexpr const char* kWorker = BRIDGE_DIST_WORKER;

TEST(Distributed, TwoRanksTensorParallel) {
  expect_all_ok(run_ranks(kWorker, {"groups", "2", "1"}, 2, std::chrono::seconds(120)));
}

TEST(Distributed, TwoRanksPipelineParallel) {
  expect_all_ok(run_ranks(kWorker, {"groups", "1", "2"}, 2, std::chrono::seconds(120)));
}

TEST(Distributed, FourRanksTp2Pp2) {
  expect_all_ok(run_ranks(kWorker, {"groups", "2", "2"}, 4, std::chrono::seconds(180)));
}

TEST(Distributed, EightRanksTp2Pp2Dp2) {
  expect_all_ok(run_ranks(kWorker, {"groups", "2", "2"}, 8, std::chrono::seconds(300)));
}

// The seconds a worker reports in "caught after <s> s", or -1.
double caught_after(const std::string& output) {
  const std::size_t at = output.find("caught after ");
  return at == std::string::npos ? -1.0 : std::stod(output.substr(at + 13));
}

TEST(Distributed, FourRanksPp2WithVirtualPipeline) {
  expect_all_ok(run_ranks(kWorker, {"groups", "2", "2", "60000", "2"}, 4, std::chrono::seconds(180)));
}

TEST(Distributed, ReinitialisingGroupsAndWorldInOneProcess) {
  expect_all_ok(run_ranks(kWorker, {"reinit"}, 2, std::chrono::seconds(180)));
}

TEST(Distributed, DeadRankFailsTheOthersWithinTheTimeout) {
  const auto results = run_ranks(kWorker, {"dead_rank", "5000"}, 3, std::chrono::seconds(120));
  EXPECT_EQ(results[2].exit_code, 17) << describe(results);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << describe(results);
    EXPECT_FALSE(results[rank].killed_at_deadline) << describe(results);
    EXPECT_THAT(results[rank].output, HasSubstr("all_reduce on group 'world'")) << describe(results);
    const double seconds = caught_after(results[rank].output);
    EXPECT_GE(seconds, 0.0) << describe(results);
    EXPECT_LT(seconds, 5.0) << describe(results);  // within the timeout: the closed connection tells at once
  }
}

TEST(Distributed, StalledRankFailsTheOthersOnceTheTimeoutPasses) {
  const auto results = run_ranks(kWorker, {"stalled_rank", "3000"}, 3, std::chrono::seconds(120));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << describe(results);
    EXPECT_THAT(results[rank].output, HasSubstr("all_reduce on group 'world'")) << describe(results);
    // The timeout fired: not before it, and well before the stalled rank ends at 9 s and closes its sockets.
    const double seconds = caught_after(results[rank].output);
    EXPECT_GE(seconds, 3.0) << describe(results);
    EXPECT_LT(seconds, 6.0) << describe(results);
  }
}

// The same binary under the real launchers, unchanged. mpirun passes no MASTER_ADDR, so the rendezvous address
// comes from the MPI bootstrap; torchrun (the one of the LibTorch the build uses) hosts the store in its agent, so rank
// 0 connects as a client.
int count_ok_lines(const std::string& output, const std::string& launcher) {
  int count = 0;
  for (std::size_t at = output.find(launcher); at != std::string::npos; at = output.find(launcher, at + 1)) {
    const std::size_t end = output.find('\n', at);
    if (output.substr(at, end - at).find(": ok") != std::string::npos) ++count;
  }
  return count;
}

TEST(Launchers, MpirunFourRanksTp2Pp2) {
  const RankResult result =
      run_command({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", kWorker, "groups", "2", "2"},
                  std::chrono::seconds(180));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(count_ok_lines(result.output, "(Open MPI, "), 4) << result.output;
}

TEST(Launchers, TorchrunTwoRanksTp2) {
  // Debian's torchrun 1.13 fails under Python 3.11 with its default redirects; explicit per-rank mappings avoid it.
  const RankResult result =
      run_command({BRIDGE_TORCHRUN, "--no_python", "--nproc_per_node=2", "-r", "0:1,1:1", "-t", "0:1,1:1",
                   "--master_addr=127.0.0.1", "--master_port=" + std::to_string(utils::find_free_port()), kWorker,
                   "groups", "2", "1"},
                  std::chrono::seconds(180));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(count_ok_lines(result.output, "(torchrun, agent store)"), 2) << result.output;
}

}  // namespace
}  // namespace bridge::testing
