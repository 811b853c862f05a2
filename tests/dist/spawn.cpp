// posix_spawn-based launcher for multi-process tests, with output captured to temporary files.
#include "tests/dist/spawn.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "utils/net.h"

extern char** environ;

namespace bridge::testing {
namespace {

// Variables of an enclosing launcher that would confuse the ranks' own detection.
bool inherited_launcher_variable(const std::string& entry) {
  for (const char* prefix : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=",
                             "OMPI_COMM_WORLD_", "PMI_", "SLURM_PROCID=", "TORCHELASTIC_"}) {
    if (entry.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

struct Child {
  pid_t pid = -1;
  std::string log_path;
  RankResult result;
  bool done = false;
};

Child spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env_vars, bool use_path) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!inherited_launcher_variable(*e)) env_strings.emplace_back(*e);
  }
  for (const auto& [key, value] : env_vars) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  Child child;
  char path_template[] = "/tmp/bridge-rank-XXXXXX";
  const int fd = ::mkstemp(path_template);
  if (fd < 0) throw std::runtime_error("spawn: mkstemp failed");
  ::close(fd);
  child.log_path = path_template;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, child.log_path.c_str(), O_WRONLY | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);  // its own group: killing it kills its children
  const int rc = use_path ? posix_spawnp(&child.pid, args[0], &actions, &attributes, args.data(), envp.data())
                          : posix_spawn(&child.pid, args[0], &actions, &attributes, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (rc != 0) throw std::runtime_error("spawn: cannot start " + argv[0] + ": " + std::to_string(rc));
  return child;
}

void wait_all(std::vector<Child>& children, std::chrono::seconds deadline) {
  const auto start = std::chrono::steady_clock::now();
  constexpr auto kGrace = std::chrono::seconds(5);  // between SIGTERM (lets mpirun/torchrun clean up) and SIGKILL
  std::size_t remaining = children.size();
  int signals_sent = 0;
  while (remaining > 0) {
    for (Child& child : children) {
      if (child.done) continue;
      int status = 0;
      const pid_t waited = ::waitpid(child.pid, &status, WNOHANG);
      if (waited == 0) continue;
      child.done = true;  // ended, or (-1) no longer ours to wait for: never spin on it
      --remaining;
      child.result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited == child.pid && WIFEXITED(status)) child.result.exit_code = WEXITSTATUS(status);
      if (waited == child.pid && WIFSIGNALED(status)) child.result.signal = WTERMSIG(status);
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if ((signals_sent == 0 && elapsed > deadline) || (signals_sent == 1 && elapsed > deadline + kGrace)) {
      for (Child& child : children) {
        if (child.done) continue;
        child.result.killed_at_deadline = true;
        ::kill(-child.pid, signals_sent == 0 ? SIGTERM : SIGKILL);
      }
      ++signals_sent;
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (Child& child : children) {
    std::ifstream log(child.log_path);
    std::stringstream text;
    text << log.rdbuf();
    child.result.output = text.str();
    std::remove(child.log_path.c_str());
  }
}

}  // namespace

std::vector<RankResult> run_ranks(const std::string& program, const std::vector<std::string>& args, int world_size,
                                  std::chrono::seconds deadline, const std::map<std::string, std::string>& extra_env) {
  const std::string port = std::to_string(utils::find_free_port());
  std::vector<Child> children;
  for (int rank = 0; rank < world_size; ++rank) {
    std::map<std::string, std::string> env = extra_env;
    env["RANK"] = env["LOCAL_RANK"] = std::to_string(rank);
    env["WORLD_SIZE"] = env["LOCAL_WORLD_SIZE"] = std::to_string(world_size);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = port;
    std::vector<std::string> argv{program};
    argv.insert(argv.end(), args.begin(), args.end());
    children.push_back(spawn(argv, env, /*use_path=*/false));
  }
  wait_all(children, deadline);
  std::vector<RankResult> results;
  for (Child& child : children) results.push_back(std::move(child.result));
  return results;
}

RankResult run_command(const std::vector<std::string>& argv, std::chrono::seconds deadline,
                       const std::map<std::string, std::string>& extra_env) {
  std::vector<Child> children{spawn(argv, extra_env, /*use_path=*/true)};
  wait_all(children, deadline);
  return children[0].result;
}

std::string describe(const std::vector<RankResult>& results) {
  std::ostringstream out;
  for (std::size_t rank = 0; rank < results.size(); ++rank) {
    const RankResult& r = results[rank];
    out << "--- rank " << rank << ": exit " << r.exit_code << (r.signal ? " signal " + std::to_string(r.signal) : "")
        << (r.killed_at_deadline ? " (killed at the deadline)" : "") << " after " << r.seconds << " s\n"
        << r.output;
  }
  return out.str();
}

void expect_all_ok(const std::vector<RankResult>& results, const std::string& marker) {
  for (const RankResult& result : results) {
    EXPECT_EQ(result.exit_code, 0) << describe(results);
    EXPECT_THAT(result.output, ::testing::HasSubstr(marker)) << describe(results);
  }
}

}  // namespace bridge::testing
