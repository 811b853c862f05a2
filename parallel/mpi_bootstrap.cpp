// The MPI side of the rendezvous bootstrap: one broadcast of rank 0's address and port.
#include "parallel/mpi_bootstrap.h"

#include <mpi.h>

#include <array>
#include <cstring>
#include <stdexcept>

#include "utils/net.h"

namespace bridge::parallel {
namespace {

void check(int code, const char* call) {
  if (code != MPI_SUCCESS) throw std::runtime_error(std::string("MPI bootstrap: ") + call + " failed");
}

}  // namespace

LaunchEnv bootstrap_rendezvous_over_mpi(LaunchEnv env) {
  int initialized = 0;
  check(MPI_Initialized(&initialized), "MPI_Initialized");
  const bool own_mpi = initialized == 0;
  if (own_mpi) check(MPI_Init(nullptr, nullptr), "MPI_Init");

  int mpi_rank = 0;
  int mpi_size = 0;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size), "MPI_Comm_size");
  if (mpi_rank != env.rank || mpi_size != env.world_size) {
    throw std::runtime_error("MPI bootstrap: MPI says rank " + std::to_string(mpi_rank) + " of " +
                             std::to_string(mpi_size) + " but the launcher's environment says rank " +
                             std::to_string(env.rank) + " of " + std::to_string(env.world_size));
  }
  std::array<char, 256> host{};
  int port = 0;
  if (env.rank == 0) {
    const std::string address = env.local_world_size == env.world_size ? "127.0.0.1" : utils::host_ipv4_address();
    std::strncpy(host.data(), address.c_str(), host.size() - 1);
    port = utils::find_free_port(address);
  }
  check(MPI_Bcast(host.data(), static_cast<int>(host.size()), MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  check(MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
  if (own_mpi) check(MPI_Finalize(), "MPI_Finalize");

  env.master_addr = std::string(host.data());
  env.master_port = port;
  return env;
}

}  // namespace bridge::parallel
