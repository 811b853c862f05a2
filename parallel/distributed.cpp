// The world state behind init_distributed: the launch environment, the rendezvous store and the world group.
#include "parallel/distributed.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>

#include "parallel/c10d_backend.h"
#include "parallel/mpi_bootstrap.h"
#include "parallel/parallel_state.h"
#include "utils/logging.h"
#include "utils/strings.h"

namespace bridge::parallel {
namespace {

// The connection to a rendezvous store, and how often each group (name and ranks) was created over it: a group
// created again (after destroy_model_parallel, or in a new world) gets fresh store keys. Members create a group
// equally often, so they agree on its keys.
struct Store {
  std::shared_ptr<detail::Rendezvous> rendezvous;
  std::map<std::string, int> creations;
};

struct World {
  LaunchEnv env;
  DistributedOptions options;
  Store* store = nullptr;  // null in a world of one
  std::shared_ptr<ProcessGroup> world_group;
};

std::unique_ptr<World>& world_state() {
  static std::unique_ptr<World> world;
  return world;
}

// The rendezvous store lives as long as the process, like the job it serves: a world initialised again after
// destroy_distributed reuses it. Tearing the store server down and starting a new one on the same port would let a
// fast peer reach the old server just before it closes.
Store& store_for(const LaunchEnv& env, const DistributedOptions& options) {
  static std::map<std::string, Store> stores;
  const std::string key = env.master_addr.value_or("") + ":" + std::to_string(env.master_port.value_or(0)) + "/" +
                          std::to_string(env.use_agent_store) + "/" + std::to_string(env.restart_count);
  Store& store = stores[key];
  if (!store.rendezvous) {
    store.rendezvous = detail::connect_rendezvous(env, options.timeout,
                                                  {options.rendezvous_timeout, options.rendezvous_timeout_source});
  }
  return store;
}

World& require_world(const char* caller) {
  if (!world_state()) {
    throw std::logic_error(std::string(caller) +
                           ": the distributed world is not initialised; call "
                           "bridge::parallel::init_distributed() first");
  }
  return *world_state();
}

}  // namespace

void init_distributed(const DistributedOptions& options) { init_distributed(detect_launch_env(), options); }

void init_distributed(const LaunchEnv& launch_env, const DistributedOptions& options) {
  if (world_state()) throw std::logic_error("init_distributed: already initialised; call destroy_distributed() first");
  if (options.backend == Backend::kNccl && !detail::nccl_available()) {
    throw std::invalid_argument(
        "init_distributed: backend 'nccl' needs LibTorch built with CUDA and NCCL; this one "
        "has neither. Use Backend::kGloo.");
  }
  if (options.backend == Backend::kNccl && !options.device.is_cuda()) {
    throw std::invalid_argument("init_distributed: backend 'nccl' needs a CUDA device, but this rank's device is " +
                                options.device.str() + "; choose a CUDA device or Backend::kGloo");
  }
  auto world = std::make_unique<World>();
  world->env = launch_env.needs_mpi_bootstrap() ? bootstrap_rendezvous_over_mpi(launch_env) : launch_env;
  world->options = options;
  std::vector<int> all(static_cast<std::size_t>(world->env.world_size));
  std::iota(all.begin(), all.end(), 0);
  utils::configure_logging(world->env.rank, world->env.world_size);
  if (world->env.world_size > 1) {
    world->store = &store_for(world->env, options);
    // Every rank arrives before any group is created, so a missing one is named within the rendezvous timeout
    // rather than found by Gloo's connect at the (longer) operation timeout.
    detail::join_world(world->store->rendezvous, "bridge/join/" + std::to_string(world->store->creations["join"]++),
                       world->env.rank, world->env.world_size,
                       {options.rendezvous_timeout, options.rendezvous_timeout_source});
  }
  world_state() = std::move(world);
  try {
    world_state()->world_group = new_group("world", all);
    utils::logger().info("initialised {} rank(s) launched by {}, backend {}, device {}, timeout {} ms", all.size(),
                         to_string(world_state()->env.launcher), to_string(options.backend), options.device.str(),
                         options.timeout.count());
  } catch (...) {
    world_state().reset();
    throw;
  }
}

bool is_distributed_initialized() { return world_state() != nullptr; }

void destroy_distributed() {
  destroy_model_parallel();  // its groups use the world's store: release them first
  world_state().reset();
}

const LaunchEnv& get_launch_env() { return require_world("get_launch_env").env; }
int get_rank() { return require_world("get_rank").env.rank; }
int get_world_size() { return require_world("get_world_size").env.world_size; }
bool is_last_rank() { return !is_distributed_initialized() || get_rank() == get_world_size() - 1; }
ProcessGroup& get_world_group() { return *require_world("get_world_group").world_group; }

std::shared_ptr<ProcessGroup> new_group(const std::string& name, const std::vector<int>& ranks) {
  World& world = require_world("new_group");
  for (int r : ranks) {
    if (r < 0 || r >= world.env.world_size || std::count(ranks.begin(), ranks.end(), r) != 1) {
      throw std::invalid_argument("new_group('" + name + "'): ranks [" + utils::join(ranks, ", ") +
                                  "] must be distinct and in [0, " + std::to_string(world.env.world_size) + ")");
    }
  }
  const auto me = std::find(ranks.begin(), ranks.end(), world.env.rank);
  if (me == ranks.end()) return nullptr;
  const int rank_in_group = static_cast<int>(me - ranks.begin());
  std::unique_ptr<detail::GroupBackend> backend;
  if (ranks.size() > 1) {
    // Identical on every member and unique per group: the store keys of different groups never collide.
    const std::string key = name + "/" + utils::join(ranks, ",");
    const std::string prefix = "bridge/" + key + "/" + std::to_string(world.store->creations[key]++);
    utils::logger().debug("creating group '{}' as rank {} of {} under store prefix {}", name, rank_in_group,
                          ranks.size(), prefix);
    backend =
        detail::create_group_backend(world.store->rendezvous, prefix, rank_in_group, static_cast<int>(ranks.size()),
                                     world.options.backend, world.options.timeout, world.options.device);
  }
  return std::make_shared<ProcessGroup>(name, ranks, rank_in_group, world.options.backend, world.options.timeout,
                                        std::move(backend));
}

}  // namespace bridge::parallel
