// Internal: the rendezvous store and group backends, implemented over c10d in c10d_backend.cpp. Nothing here exposes
// a c10d type, so LibTorch version differences stay in that one file.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "parallel/launch_env.h"
#include "parallel/process_group.h"

namespace bridge::parallel::detail {

/// The job's TCPStore connection (opaque).
class Rendezvous;

/// Connects to (or, on the store-server rank, starts) the TCPStore at env.master_addr:master_port. Under torchrun's
/// agent store every rank is a client under torchrun's "/worker/attempt_<n>" prefix.
std::shared_ptr<Rendezvous> connect_rendezvous(const LaunchEnv& env, std::chrono::milliseconds timeout);

/// The backend of one group: `rank` of `size` members that all call this with the same unique `prefix`. An NCCL
/// group is bound to `device` (this rank's CUDA device), which its barrier and communicators use.
std::unique_ptr<GroupBackend> create_group_backend(const std::shared_ptr<Rendezvous>& rendezvous,
                                                   const std::string& prefix, int rank, int size, Backend backend,
                                                   std::chrono::milliseconds timeout, const torch::Device& device);

/// Whether this LibTorch was built with CUDA and NCCL.
bool nccl_available();

}  // namespace bridge::parallel::detail
