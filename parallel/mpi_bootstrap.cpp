// The MPI side of the rendezvous bootstrap: one broadcast of rank 0's address and port.
#include "parallel/mpi_bootstrap.h"

#include <mpi.h>

#include <array>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "utils/net.h"

namespace bridge::parallel {
namespace {

void check(int code, const char* call) {
  if (code != MPI_SUCCESS) throw std::runtime_error(std::string("MPI bootstrap: ") + call + " failed");
}

}  // namespace

LaunchEnv bootstrap_rendezvous_over_mpi(LaunchEnv env) {
  // MPI can be initialised once per process: a second world in the same process reuses the first answer.
  static std::optional<std::pair<std::string, int>> answer;
  if (answer) {
    env.master_addr = answer->first;
    env.master_port = answer->second;
    return env;
  }
  int finalized = 0;
  check(MPI_Finalized(&finalized), "MPI_Finalized");
  if (finalized != 0)
    throw std::runtime_error("MPI bootstrap: MPI was already finalised; set MASTER_ADDR and MASTER_PORT");
  int initialized = 0;
  check(MPI_Initialized(&initialized), "MPI_Initialized");
  const bool own_mpi = initialized == 0;
  if (own_mpi) check(MPI_Init(nullptr, nullptr), "MPI_Init");

  int mpi_rank = 0;
  int mpi_size = 0;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size), "MPI_Comm_size");
  // Rank 0 sends its address and a free port, or (port 0) the reason it has none, so no rank waits for nothing.
  std::array<char, 512> text{};
  int port = 0;
  if (mpi_rank == 0) {
    try {
      const std::string address = env.local_world_size == env.world_size ? "127.0.0.1" : utils::host_ipv4_address();
      port = utils::find_free_port(address);
      std::strncpy(text.data(), address.c_str(), text.size() - 1);
    } catch (const std::exception& error) {
      std::strncpy(text.data(), error.what(), text.size() - 1);
    }
  }
  check(MPI_Bcast(text.data(), static_cast<int>(text.size()), MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  check(MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
  if (own_mpi) check(MPI_Finalize(), "MPI_Finalize");

  if (mpi_rank != env.rank || mpi_size != env.world_size) {
    throw std::runtime_error("MPI bootstrap: MPI says rank " + std::to_string(mpi_rank) + " of " +
                             std::to_string(mpi_size) + " but the launcher's environment says rank " +
                             std::to_string(env.rank) + " of " + std::to_string(env.world_size));
  }
  if (port == 0)
    throw std::runtime_error("MPI bootstrap: rank 0 found no rendezvous address: " + std::string(text.data()));
  answer = std::make_pair(std::string(text.data()), port);
  env.master_addr = answer->first;
  env.master_port = answer->second;
  return env;
}

}  // namespace bridge::parallel
