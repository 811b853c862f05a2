// The job's world: initialisation from the launcher's environment and creation of process groups.
//
//   bridge::parallel::init_distributed();          // torchrun, mpirun, srun or alone: no code change
//   auto& world = bridge::parallel::get_world_group();
//   ...
//   bridge::parallel::destroy_distributed();
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "parallel/launch_env.h"
#include "parallel/process_group.h"

namespace bridge::parallel {

struct DistributedOptions {
  Backend backend = Backend::kGloo;
  /// Limit for every operation (and the creation of every group); a dead peer surfaces as a CommunicationError
  /// within it.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  /// Limit for joining the world: reaching the rendezvous store, and every rank arriving there. After it, each rank
  /// that waited names the ranks that never joined; one that could not reach the store names the address it tried.
  std::chrono::milliseconds rendezvous_timeout = std::chrono::minutes(2);
  /// Where rendezvous_timeout was set, named in those errors (e.g. a config key).
  std::string rendezvous_timeout_source = "DistributedOptions::rendezvous_timeout";
  /// This rank's device (see device.h: select_device, bind_device). NCCL groups are bound to it and need it to be
  /// CUDA; Gloo works with CPU and CUDA tensors alike.
  torch::Device device = torch::kCPU;
};

/// Initialises the world from this process's environment (detect_launch_env), bootstrapping the rendezvous address
/// over MPI when an MPI launcher gave none. A world of one needs no store and no network. Throws if already
/// initialised.
void init_distributed(const DistributedOptions& options = {});
/// The same from an explicit environment.
void init_distributed(const LaunchEnv& env, const DistributedOptions& options);

bool is_distributed_initialized();
/// Releases the model-parallel groups (destroy_model_parallel) and every other group; init_distributed may be
/// called again afterwards. The connection to the rendezvous store is kept for the life of the process.
void destroy_distributed();

const LaunchEnv& get_launch_env();
int get_rank();
int get_world_size();
/// Whether this process is the world's last rank, where Megatron logs and writes metrics (it holds the loss). True
/// when no world is initialised: a lone process is its own last rank.
bool is_last_rank();
ProcessGroup& get_world_group();

/// A group of the global `ranks` (in group-rank order), or nullptr on a rank that is not a member. Only members
/// take part; `name` ("tp", "dp", ...) appears in errors. Members must create their common groups in the same order.
std::shared_ptr<ProcessGroup> new_group(const std::string& name, const std::vector<int>& ranks);

}  // namespace bridge::parallel
