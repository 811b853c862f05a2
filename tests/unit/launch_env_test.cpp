// detect_launch_env for each launcher's variables (as torchrun 1.13 and Open MPI 4.1 set them), alone, and with
// inconsistent values.
#include "parallel/launch_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

namespace bridge::parallel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

LaunchEnv detect(const std::map<std::string, std::string>& vars) {
  return detect_launch_env([&](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

TEST(LaunchEnv, AloneIsAWorldOfOne) {
  const LaunchEnv env = detect({});
  EXPECT_EQ(env.launcher, Launcher::kNone);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_FALSE(env.master_addr.has_value());
  EXPECT_FALSE(env.needs_mpi_bootstrap());
  EXPECT_TRUE(env.is_store_server());
}

TEST(LaunchEnv, Torchrun) {
  const LaunchEnv env = detect({{"RANK", "3"},
                                {"WORLD_SIZE", "4"},
                                {"LOCAL_RANK", "1"},
                                {"LOCAL_WORLD_SIZE", "2"},
                                {"MASTER_ADDR", "10.0.0.1"},
                                {"MASTER_PORT", "29500"},
                                {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                {"TORCHELASTIC_RESTART_COUNT", "2"},
                                {"OMPI_COMM_WORLD_RANK", "0"}});  // RANK wins over an outer MPI launcher
  EXPECT_EQ(env.launcher, Launcher::kTorchrun);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_TRUE(env.use_agent_store);
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_FALSE(env.is_store_server());
}

TEST(LaunchEnv, AgentStoreMakesRankZeroAClient) {
  std::map<std::string, std::string> vars = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  EXPECT_TRUE(detect(vars).is_store_server());
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_TRUE(detect(vars).is_store_server());
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  EXPECT_FALSE(detect(vars).is_store_server());
}

TEST(LaunchEnv, OpenMpiWithoutMasterNeedsBootstrap) {
  const LaunchEnv env = detect({{"OMPI_COMM_WORLD_RANK", "1"},
                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(env.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_TRUE(env.needs_mpi_bootstrap());
}

TEST(LaunchEnv, OpenMpiWithMasterFromCommandLine) {
  const LaunchEnv env = detect({{"OMPI_COMM_WORLD_RANK", "0"},
                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"MASTER_ADDR", "node1"},
                                {"MASTER_PORT", "1234"}});
  EXPECT_FALSE(env.needs_mpi_bootstrap());
  EXPECT_EQ(env.local_world_size, 2);  // no local size given: assume one node
}

TEST(LaunchEnv, MpichAndSlurm) {
  const LaunchEnv mpich =
      detect({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "2"}});
  EXPECT_EQ(mpich.launcher, Launcher::kMpich);
  EXPECT_EQ(mpich.rank, 2);
  EXPECT_EQ(mpich.local_rank, 0);
  EXPECT_EQ(mpich.local_world_size, 2);
  const LaunchEnv slurm = detect({{"SLURM_PROCID", "5"},
                                  {"SLURM_NTASKS", "8"},
                                  {"SLURM_LOCALID", "1"},
                                  {"SLURM_NTASKS_PER_NODE", "4"},
                                  {"MASTER_ADDR", "n0"},
                                  {"MASTER_PORT", "29400"}});
  EXPECT_EQ(slurm.launcher, Launcher::kSlurm);
  EXPECT_EQ(slurm.rank, 5);
  EXPECT_EQ(slurm.local_rank, 1);
  EXPECT_EQ(slurm.local_world_size, 4);
}

TEST(LaunchEnv, InconsistentEnvironmentsAreClearErrors) {
  auto fails = [](std::map<std::string, std::string> vars, const std::string& message) {
    EXPECT_THAT([&] { detect(vars); }, ThrowsMessage<std::invalid_argument>(HasSubstr(message)));
  };
  fails({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}},
        "RANK=4 is not in [0, WORLD_SIZE=4)");
  fails({{"RANK", "x"}, {"WORLD_SIZE", "4"}}, "RANK='x' is not an integer");
  fails({{"RANK", "0"}}, "RANK is set but WORLD_SIZE is not");
  fails({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0 must be >= 1");
  fails({{"RANK", "1"}, {"WORLD_SIZE", "2"}}, "MASTER_ADDR and MASTER_PORT are not");
  fails({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}, "MASTER_ADDR is set but MASTER_PORT is not");
  fails({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}},
        "MASTER_PORT=70000 is not a TCP port");
  fails({{"OMPI_COMM_WORLD_RANK", "0"},
         {"OMPI_COMM_WORLD_SIZE", "2"},
         {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
        "OMPI_COMM_WORLD_LOCAL_RANK=2 is not in [0, 2)");
  fails({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}, "under Slurm, set MASTER_ADDR and MASTER_PORT");
}

TEST(LaunchEnv, SingleRankTorchrunNeedsNoStoreAddress) {
  const LaunchEnv env = detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(env.world_size, 1);
  EXPECT_FALSE(env.needs_mpi_bootstrap());
}

}  // namespace
}  // namespace bridge::parallel
