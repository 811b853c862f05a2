// Finds the rendezvous address for an mpirun job that did not pass MASTER_ADDR/MASTER_PORT: rank 0 picks its address
// and a free port and broadcasts them over MPI, so multi-node mpirun needs no extra flags. MPI is used for nothing
// else: all training communication goes through c10d.
#pragma once

#include "parallel/launch_env.h"

namespace bridge::parallel {

/// `env` with master_addr/master_port filled in from rank 0. Collective over the MPI world: every rank must call it.
/// A job that fits on one node uses the loopback address.
LaunchEnv bootstrap_rendezvous_over_mpi(LaunchEnv env);

}  // namespace bridge::parallel
