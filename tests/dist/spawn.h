// Test support: runs N copies of a program as the ranks of one job, with the launcher variables torchrun would set,
// and a hard deadline after which every rank still running is killed (so a test never hangs).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace bridge::testing {

struct RankResult {
  int exit_code = -1;  ///< -1 if killed by a signal
  int signal = 0;      ///< the signal that ended it, if any
  bool killed_at_deadline = false;
  double seconds = 0.0;  ///< from the spawn of all ranks to this rank's end
  std::string output;    ///< stdout and stderr together
};

/// Runs `program args...` as ranks 0..world_size-1 on 127.0.0.1 with a fresh MASTER_PORT, each with RANK,
/// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and `extra_env` set.
std::vector<RankResult> run_ranks(const std::string& program, const std::vector<std::string>& args, int world_size,
                                  std::chrono::seconds deadline,
                                  const std::map<std::string, std::string>& extra_env = {});

/// Runs one command (argv[0] looked up in PATH) with a deadline; returns its result.
RankResult run_command(const std::vector<std::string>& argv, std::chrono::seconds deadline,
                       const std::map<std::string, std::string>& extra_env = {});

/// "rank 2: exit 1\n<output>" for every rank, for failure messages.
std::string describe(const std::vector<RankResult>& results);

/// A GoogleTest check that every rank exited 0 and printed `marker` (workers print "<scenario>: ok" on success).
void expect_all_ok(const std::vector<RankResult>& results, const std::string& marker = ": ok");

}  // namespace bridge::testing
