// Real multi-process tests: 2, 4 and 8 ranks on this machine check every collective on every group (the expert
// groups of MoE layers and the context-parallel combinations too, each either an earlier group's object or a group of
// its own; 2 and 3 ranks the uneven
// all-to-all of MoE token dispatch), a rank that
// dies makes the others fail with a clear error within the timeout, and a rendezvous that cannot complete (a rank
// missing, a wrong MASTER_PORT, the torchrun of another PyTorch) fails in one line within its own shorter limit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <thread>

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

// Megatron-Core's expert groups (moe_ep.md 2.1): tp 1 with ep 2 on 2 ranks reuses dense groups only; on 4 ranks the
// ep and expert-dp groups are new; tp 2 with ep 2 and expert tp 1 reuses the dense ones; with pp 2, tp-ep-pp is new.
TEST(Distributed, TwoRanksExpertParallel) {
  expect_all_ok(run_ranks(kWorker, {"expert", "1", "1", "2", "0"}, 2, std::chrono::seconds(120)));
}

TEST(Distributed, FourRanksExpertParallel) {
  for (const std::vector<std::string>& sizes : std::vector<std::vector<std::string>>{
           {"1", "1", "2", "0"}, {"2", "1", "2", "1"}, {"1", "2", "2", "0"}, {"2", "1", "2", "2"}}) {
    std::vector<std::string> args = {"expert"};
    args.insert(args.end(), sizes.begin(), sizes.end());
    SCOPED_TRACE("tp pp ep etp " + sizes[0] + " " + sizes[1] + " " + sizes[2] + " " + sizes[3]);
    expect_all_ok(run_ranks(kWorker, args, 4, std::chrono::seconds(180)));
  }
}

// Context parallelism (order tp-cp-ep-dp-pp): the cp, dp-cp, tp-cp and tp-dp-cp groups on real ranks, each combined
// group sharing an earlier group where the ranks coincide (dp 1: dp-cp is cp; tp 1: tp-cp is cp), and expert
// parallelism folded over dp x cp (cp 2 with ep 2: the ep pairs are the cp pairs).
TEST(Distributed, FourRanksContextParallel) {
  for (const std::vector<std::string>& sizes : std::vector<std::vector<std::string>>{{"1", "1", "2", "0", "2"},
                                                                                     {"2", "1", "1", "0", "2"},
                                                                                     {"1", "2", "1", "0", "2"},
                                                                                     {"1", "1", "1", "0", "4"}}) {
    std::vector<std::string> args = {"expert"};
    args.insert(args.end(), sizes.begin(), sizes.end());
    SCOPED_TRACE("tp pp ep etp cp " + sizes[0] + " " + sizes[1] + " " + sizes[2] + " " + sizes[3] + " " + sizes[4]);
    expect_all_ok(run_ranks(kWorker, args, 4, std::chrono::seconds(180)));
  }
}

// tp 2 x cp 2 x dp 2: every group kind has two or more members and tp-dp-cp is the world.
TEST(Distributed, EightRanksTp2Cp2Dp2) {
  expect_all_ok(run_ranks(kWorker, {"expert", "2", "1", "1", "0", "2"}, 8, std::chrono::seconds(300)));
}

// ProcessGroup::all_to_all with uneven splits (zero ones, a rank that sends nothing), both ways, on real ranks.
TEST(Distributed, AllToAllUnevenSplitsTwoRanks) {
  expect_all_ok(run_ranks(kWorker, {"all_to_all"}, 2, std::chrono::seconds(120)));
}

TEST(Distributed, AllToAllUnevenSplitsThreeRanks) {
  expect_all_ok(run_ranks(kWorker, {"all_to_all"}, 3, std::chrono::seconds(120)));
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

// A rank's run of `dist_worker join`: `rank` of `world_size` at 127.0.0.1:port, as torchrun would start it.
RankResult join_as(int rank, int world_size, int port, int rendezvous_ms) {
  return run_command({kWorker, "join", std::to_string(rendezvous_ms)}, std::chrono::seconds(60),
                     {{"RANK", std::to_string(rank)},
                      {"LOCAL_RANK", std::to_string(rank)},
                      {"WORLD_SIZE", std::to_string(world_size)},
                      {"LOCAL_WORLD_SIZE", std::to_string(world_size)},
                      {"MASTER_ADDR", "127.0.0.1"},
                      {"MASTER_PORT", std::to_string(port)}});
}

// The seconds a worker reports in "failed after <s> s", or -1.
double failed_after(const std::string& output) {
  const std::size_t at = output.find("failed after ");
  return at == std::string::npos ? -1.0 : std::stod(output.substr(at + 13));
}

// The failure in one line, and nothing else but the log line naming the Gloo address: no c10d retry warnings, no
// backtraces.
void expect_one_quiet_line(const RankResult& result) {
  EXPECT_THAT(result.output, ::testing::Not(HasSubstr("[c10d]"))) << result.output;
  EXPECT_THAT(result.output, ::testing::Not(HasSubstr("frame #"))) << result.output;
  EXPECT_LE(std::count(result.output.begin(), result.output.end(), '\n'), 2) << result.output;
}

TEST(Rendezvous, ARankThatNeverJoinsIsNamedOnEveryRankOnceTheRendezvousTimeoutPasses) {
  const int port = utils::find_free_port();
  auto rank1 = std::async(std::launch::async, [&] { return join_as(1, 3, port, 3000); });
  const RankResult rank0 = join_as(0, 3, port, 3000);  // rank 2 is never started
  const RankResult other = rank1.get();
  const std::string store = "127.0.0.1:" + std::to_string(port);
  for (const RankResult* result : {&rank0, &other}) {
    EXPECT_EQ(result->exit_code, 3) << result->output;
    EXPECT_THAT(result->output, HasSubstr("rank 2 of 3 never joined the rendezvous at " + store +
                                          " within 3 s (DistributedOptions::rendezvous_timeout): check it was "
                                          "started, and that its MASTER_ADDR/MASTER_PORT are " +
                                          store));
    EXPECT_GE(failed_after(result->output), 2.5) << result->output;  // rank 1 starts a moment after rank 0
    EXPECT_LT(failed_after(result->output), 8.0) << result->output;
    expect_one_quiet_line(*result);
  }
}

TEST(Rendezvous, AWrongMasterPortFailsBothRanksWithinTheRendezvousTimeout) {
  const int port = utils::find_free_port();
  const int wrong = utils::find_free_port();  // nothing listens there
  auto rank1 = std::async(std::launch::async, [&] { return join_as(1, 2, wrong, 3000); });
  const RankResult rank0 = join_as(0, 2, port, 3000);
  const RankResult lost = rank1.get();
  EXPECT_EQ(rank0.exit_code, 3) << rank0.output;
  EXPECT_THAT(rank0.output, HasSubstr("rank 1 of 2 never joined the rendezvous at 127.0.0.1:" + std::to_string(port)));
  EXPECT_EQ(lost.exit_code, 3) << lost.output;
  EXPECT_THAT(lost.output,
              HasSubstr("rank 1 of 2 could not reach the rendezvous store at 127.0.0.1:" + std::to_string(wrong) +
                        " within 3 s (DistributedOptions::rendezvous_timeout) "
                        "(connection refused): check that MASTER_ADDR/MASTER_PORT"));
  for (const RankResult* result : {&rank0, &lost}) {
    EXPECT_GE(failed_after(result->output), 3.0) << result->output;
    EXPECT_LT(failed_after(result->output), 8.0) << result->output;
    expect_one_quiet_line(*result);
  }
}

TEST(Rendezvous, RanksThatStartSecondsApartStillMeet) {
  const int port = utils::find_free_port();
  auto rank0 = std::async(std::launch::async, [&] { return join_as(0, 2, port, 20000); });
  std::this_thread::sleep_for(std::chrono::seconds(2));  // rank 0 waits for rank 1 (not a failure)
  const RankResult rank1 = join_as(1, 2, port, 20000);
  const RankResult first = rank0.get();
  EXPECT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(rank1.exit_code, 0) << rank1.output;
  EXPECT_THAT(first.output, HasSubstr("join: ok"));
  EXPECT_THAT(rank1.output, HasSubstr("join: ok"));

  // A client started before the store exists (rank 1 first) waits quietly for it.
  const int second_port = utils::find_free_port();
  auto early = std::async(std::launch::async, [&] { return join_as(1, 2, second_port, 20000); });
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const RankResult late = join_as(0, 2, second_port, 20000);
  const RankResult waited = early.get();
  EXPECT_EQ(late.exit_code, 0) << late.output;
  EXPECT_EQ(waited.exit_code, 0) << waited.output;
  EXPECT_THAT(waited.output, ::testing::Not(HasSubstr("[c10d]"))) << waited.output;
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

// Debian's torchrun (PyTorch 1.13) hosts a store that closes the connection at the 2.x client's validation query:
// each rank must say so in seconds, naming the launcher to use, instead of retrying until the timeout.
TEST(Launchers, TorchrunOfAnotherPyTorchIsNamedInSeconds) {
  const std::string other = BRIDGE_OTHER_TORCHRUN;
  if (::access(other.c_str(), X_OK) != 0) GTEST_SKIP() << other << " is not installed (python3-torch)";
  std::error_code error;
  if (std::filesystem::equivalent(other, BRIDGE_TORCHRUN, error)) {
    GTEST_SKIP() << other << " is the torchrun of the LibTorch this build uses";
  }
  const auto start = std::chrono::steady_clock::now();
  const RankResult result = run_command(
      {other, "--no_python", "--nproc_per_node=2", "-r", "0:1,1:1", "-t", "0:1,1:1", "--master_addr=127.0.0.1",
       "--master_port=" + std::to_string(utils::find_free_port()), kWorker, "join", "60000"},
      std::chrono::seconds(120));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_LT(seconds, 30.0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("closed the connection during c10d's handshake, as a store of another PyTorch "
                                       "version does: the launcher (torchrun) is not from bridge's PyTorch"))
      << result.output;
  EXPECT_THAT(result.output, HasSubstr("Launch with the torchrun of PyTorch")) << result.output;
  // A wheel's LibTorch names the torchrun beside it: the one this build's tests use.
  const std::string named = "Launch with the torchrun of PyTorch ";
  const std::size_t at = result.output.find(named);
  if (std::string(BRIDGE_TORCHRUN).find("/bin/torchrun") != std::string::npos && at != std::string::npos) {
    const std::size_t colon = result.output.find(": ", at);
    const std::size_t end = result.output.find('\n', at);
    ASSERT_LT(colon, end) << result.output;
    EXPECT_TRUE(std::filesystem::equivalent(result.output.substr(colon + 2, end - colon - 2), BRIDGE_TORCHRUN, error))
        << result.output;
  }
  EXPECT_THAT(result.output, ::testing::Not(HasSubstr("recvValue failed"))) << result.output;
  EXPECT_THAT(result.output, ::testing::Not(HasSubstr("frame #"))) << result.output;
}

}  // namespace
}  // namespace bridge::testing
