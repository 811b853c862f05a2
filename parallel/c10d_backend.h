// Internal: the rendezvous store and group backends, implemented over c10d in c10d_backend.cpp. Nothing here exposes
// a c10d type, so LibTorch version differences stay in that one file.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "parallel/launch_env.h"
#include "parallel/process_group.h"
#include "parallel/rendezvous_checks.h"

namespace bridge::parallel::detail {

/// The job's TCPStore connection (opaque).
class Rendezvous;

/// Connects to (or, on the store-server rank, starts) the TCPStore at env.master_addr:master_port, whose operations
/// then wait up to `timeout`. Under torchrun's agent store every rank is a client under torchrun's
/// "/worker/attempt_<n>" prefix. A client that finds nothing accepting connections there within `limit`, or a store
/// that closes the connection during c10d's handshake (another PyTorch's torchrun), fails with one line saying so.
/// Chooses (and logs) the address this process's Gloo groups advertise: see choose_gloo_address.
std::shared_ptr<Rendezvous> connect_rendezvous(const LaunchEnv& env, std::chrono::milliseconds timeout,
                                               const RendezvousLimit& limit);

/// Rank `rank` of `world_size` announces itself under the store prefix `prefix` (unique to this world) and waits
/// within `limit` for every other rank to do the same. Throws, on every rank that waited, naming the ranks that
/// never joined, or a rank whose Gloo address is a loopback one that ranks on other hosts would have to reach.
void join_world(const std::shared_ptr<Rendezvous>& rendezvous, const std::string& prefix, int rank, int world_size,
                const RendezvousLimit& limit);

/// The backend of one group: `rank` of `size` members that all call this with the same unique `prefix`. An NCCL
/// group is bound to `device` (this rank's CUDA device), which its barrier and communicators use.
std::unique_ptr<GroupBackend> create_group_backend(const std::shared_ptr<Rendezvous>& rendezvous,
                                                   const std::string& prefix, int rank, int size, Backend backend,
                                                   std::chrono::milliseconds timeout, const torch::Device& device);

/// Whether this LibTorch was built with CUDA and NCCL.
bool nccl_available();

}  // namespace bridge::parallel::detail
