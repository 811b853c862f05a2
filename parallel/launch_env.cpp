// detect_launch_env: each launcher's variables, parsed and cross-checked.
#include "parallel/launch_env.h"

#include <cstdlib>
#include <stdexcept>

namespace bridge::parallel {
namespace {

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument("launch environment: " + message); }

int parse_int(const std::string& name, const std::string& value) {
  try {
    std::size_t used = 0;
    const int parsed = std::stoi(value, &used);
    if (used == value.size()) return parsed;
  } catch (const std::exception&) {
  }
  fail(name + "='" + value + "' is not an integer");
}

// The launcher's variable names for rank, size, local rank and local size.
struct Names {
  Launcher launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

constexpr Names kLaunchers[] = {
    {Launcher::kTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {Launcher::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {Launcher::kMpich, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {Launcher::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

}  // namespace

std::string_view to_string(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone:
      return "none";
    case Launcher::kTorchrun:
      return "torchrun";
    case Launcher::kOpenMpi:
      return "Open MPI";
    case Launcher::kMpich:
      return "MPICH/PMI";
    case Launcher::kSlurm:
      return "Slurm";
  }
  return "unknown";
}

LaunchEnv detect_launch_env(const EnvLookup& env) {
  LaunchEnv result;
  const Names* names = nullptr;
  for (const Names& candidate : kLaunchers) {
    if (env(candidate.rank)) {
      names = &candidate;
      break;
    }
  }
  if (names == nullptr) return result;  // alone: a world of one, no store, no network

  result.launcher = names->launcher;
  auto read_int = [&](const char* name) -> std::optional<int> {
    const std::optional<std::string> value = env(name);
    return value ? std::optional<int>(parse_int(name, *value)) : std::nullopt;
  };
  result.rank = *read_int(names->rank);
  const std::optional<int> size = read_int(names->size);
  if (!size) fail(std::string(names->rank) + " is set but " + names->size + " is not; set both");
  result.world_size = *size;
  if (result.world_size < 1) fail(std::string(names->size) + "=" + std::to_string(result.world_size) + " must be >= 1");
  if (result.rank < 0 || result.rank >= result.world_size) {
    fail(std::string(names->rank) + "=" + std::to_string(result.rank) + " is not in [0, " + names->size + "=" +
         std::to_string(result.world_size) + ")");
  }
  // Without local information, assume one node.
  result.local_rank = read_int(names->local_rank).value_or(result.rank);
  const std::optional<std::string> local_size_text = env(names->local_size);
  // Slurm writes e.g. "4(x2)"; the leading count is the tasks on this node.
  result.local_world_size = local_size_text
                                ? parse_int(names->local_size, local_size_text->substr(0, local_size_text->find('(')))
                                : result.world_size;
  if (result.local_rank < 0 || result.local_rank >= result.local_world_size) {
    fail(std::string(names->local_rank) + "=" + std::to_string(result.local_rank) + " is not in [0, " +
         std::to_string(result.local_world_size) + ")");
  }

  result.master_addr = env("MASTER_ADDR");
  result.master_port = read_int("MASTER_PORT");
  if (result.master_addr && result.master_addr->empty()) fail("MASTER_ADDR is set but empty");
  if (result.master_port && (*result.master_port < 1 || *result.master_port > 65535)) {
    fail("MASTER_PORT=" + std::to_string(*result.master_port) + " is not a TCP port in [1, 65535]");
  }
  if (result.master_addr.has_value() != result.master_port.has_value()) {
    fail(std::string(result.master_addr ? "MASTER_ADDR is set but MASTER_PORT is not"
                                        : "MASTER_PORT is set but MASTER_ADDR is not") +
         "; set both, or neither under an MPI launcher to find them automatically");
  }
  if (result.world_size > 1 && !result.master_addr && result.launcher == Launcher::kTorchrun) {
    fail("RANK and WORLD_SIZE=" + std::to_string(result.world_size) +
         " are set but MASTER_ADDR and MASTER_PORT are not; torchrun sets all four, set them by hand otherwise");
  }
  if (result.world_size > 1 && !result.master_addr && result.launcher == Launcher::kSlurm) {
    fail("under Slurm, set MASTER_ADDR and MASTER_PORT (e.g. the first host of $SLURM_JOB_NODELIST and a free port)");
  }
  result.use_agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  result.restart_count = read_int("TORCHELASTIC_RESTART_COUNT").value_or(0);
  return result;
}

LaunchEnv detect_launch_env() {
  return detect_launch_env([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  });
}

}  // namespace bridge::parallel
