// Where this process sits in a job, read from the launcher's environment, so one binary runs unchanged under
// torchrun, mpirun (Open MPI, MPICH/Hydra), srun (Slurm), or alone.
//
// Precedence for the rank: RANK (torchrun, or set by hand) -> OMPI_COMM_WORLD_RANK -> PMI_RANK -> SLURM_PROCID ->
// alone. MASTER_ADDR/MASTER_PORT locate the rendezvous store; under an MPI launcher without them, rank 0's address
// and a free port are found and broadcast over MPI (see mpi_bootstrap.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace bridge::parallel {

enum class Launcher : std::uint8_t { kNone, kTorchrun, kOpenMpi, kMpich, kSlurm };

std::string_view to_string(Launcher launcher);

struct LaunchEnv {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  /// torchrun's agent already hosts the store (TORCHELASTIC_USE_AGENT_STORE=True): every rank, rank 0 included,
  /// connects as a client, under the prefix "/worker/attempt_<restart_count>" that torchrun's workers use.
  bool use_agent_store = false;
  int restart_count = 0;

  /// Whether this rank starts the rendezvous store server.
  bool is_store_server() const { return rank == 0 && !use_agent_store; }
  /// Whether the store address must still be found over MPI (an MPI launcher without MASTER_ADDR/MASTER_PORT).
  bool needs_mpi_bootstrap() const { return world_size > 1 && !master_addr.has_value(); }
};

/// Reads a variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// The launch environment described by `env`. Inconsistent values throw std::invalid_argument naming the variable
/// and the fix (a rank not below the world size, a non-integer rank, a port out of range, MASTER_ADDR without
/// MASTER_PORT, a multi-rank torchrun-style job without MASTER_ADDR/MASTER_PORT, ...).
LaunchEnv detect_launch_env(const EnvLookup& env);
/// The same, from this process's environment.
LaunchEnv detect_launch_env();

}  // namespace bridge::parallel
