// preflight(): each rank checks what it will write and what it will allocate; one all-gather of the error messages
// then fails every rank together with the first one.
#include "training/preflight.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "parallel/distributed.h"
#include "parallel/process_group.h"
#include "training/utils/cuda_memory.h"
#include "training/utils/theoretical_memory.h"
#include "utils/exception_message.h"
#include "utils/logging.h"
#include "utils/write_probe.h"

namespace bridge::training {
namespace {

using utils::format_bytes;

// The cores this process may run on (its affinity mask: taskset, a container's cpuset), not the machine's.
int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
}

// A number from a /proc or /sys file ("MemAvailable:  123 kB" with `key`, or a bare number); nullopt when absent or
// not a number ("max").
std::optional<double> read_number(const std::string& path, const std::string& key = "", double scale = 1) {
  std::ifstream in(path);
  std::string word;
  while (in >> word) {
    if (!key.empty() && word != key) continue;
    if (!key.empty() && !(in >> word)) return std::nullopt;
    try {
      return std::stod(word) * scale;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

// Host memory this node's processes can still take: MemAvailable, lowered by a cgroup (v2 or v1) limit.
std::optional<double> host_memory_available() {
  std::optional<double> available = read_number("/proc/meminfo", "MemAvailable:", 1024);
  std::optional<double> limit = read_number("/sys/fs/cgroup/memory.max");
  std::optional<double> used = read_number("/sys/fs/cgroup/memory.current");
  if (!limit) {
    limit = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  if (limit && used && *limit < 1e18) {
    const double headroom = std::max(0.0, *limit - *used);
    available = available ? std::min(*available, headroom) : headroom;
  }
  return available;
}

void check_output_paths(const ConfigContainer& config, int rank, int world_size) {
  // Every rank may write a checkpoint file; the metric writers live on the last rank.
  if (!config.checkpoint.save.empty()) {
    bridge::utils::require_writable_directory(config.checkpoint.save, "checkpoint.save");
  }
  if (rank != world_size - 1) return;
  if (!config.logging.tensorboard_dir.empty()) {
    bridge::utils::require_writable_directory(config.logging.tensorboard_dir, "logging.tensorboard_dir");
  }
  if (!config.logging.jsonl_path.empty()) {
    bridge::utils::require_writable_file(config.logging.jsonl_path, "logging.jsonl_path");
  }
}

// What the run is told to read must be there: a checkpoint.load that does not exist is a typo or a missing mount, not
// a fresh start (checkpoint.auto_resume covers a job that resumes only once checkpoints exist).
void check_input_paths(const ConfigContainer& config) {
  std::error_code error;
  const std::string& load = config.checkpoint.load;
  if (!load.empty() && !std::filesystem::is_directory(load, error)) {
    throw std::invalid_argument(
        "checkpoint.load: no directory at '" + load +
        "'; point it at a directory that checkpoint.save wrote, or, for a job that resumes only when checkpoints "
        "exist, unset it and set checkpoint.auto_resume=true with checkpoint.save");
  }
  const std::string& pretrained = config.checkpoint.pretrained_checkpoint;
  const std::string hf_prefix = "hf:";
  const std::string pretrained_dir =
      pretrained.rfind(hf_prefix, 0) == 0 ? pretrained.substr(hf_prefix.size()) : pretrained;
  if (!pretrained.empty() && !std::filesystem::is_directory(pretrained_dir, error)) {
    throw std::invalid_argument("checkpoint.pretrained_checkpoint: no directory at '" + pretrained_dir +
                                "'; point it at a checkpoint directory (or hf:<a Hugging Face model directory>)");
  }
}

// One checkpoint must fit on checkpoint.save's disk: each node checks its share (a shared filesystem holds them all,
// so this is a lower bound there).
void check_checkpoint_space(const ConfigContainer& config, int world_size, const parallel::LaunchEnv& env) {
  if (config.checkpoint.save.empty() || env.local_rank != 0) return;
  const models::GPTConfig& m = config.model;
  const double parameters = utils::num_parameters(m, config.parallelism.tensor_model_parallel_size);
  const utils::MemoryEstimate per_rank = utils::estimate_memory(config, world_size);
  const double bytes_per_parameter = (per_rank.weights + per_rank.optimizer) / std::max(1.0, per_rank.parameters);
  const double checkpoint = parameters * bytes_per_parameter;
  const int nodes = std::max(1, world_size / std::max(1, env.local_world_size));
  const double needed = checkpoint / nodes;
  const double available = static_cast<double>(bridge::utils::available_disk_bytes(config.checkpoint.save));
  if (needed > available) {
    throw std::invalid_argument("checkpoint.save: one checkpoint needs about " + format_bytes(checkpoint) +
                                (nodes > 1 ? " (" + format_bytes(needed) + " from this node)" : std::string()) +
                                " but " + bridge::utils::nearest_existing(config.checkpoint.save).string() + " has " +
                                format_bytes(available) +
                                " free; point checkpoint.save at a larger disk or free space there");
  }
}

void check_memory(const ConfigContainer& config, int world_size, const torch::Device& device,
                  const parallel::LaunchEnv& env) {
  const utils::MemoryEstimate estimate = utils::estimate_memory(config, world_size);
  if (parallel::get_rank() == 0) {
    bridge::utils::logger().info("theoretical memory per rank: {}", utils::describe(estimate));
  }
  std::optional<double> available;
  std::string where;
  if (device.is_cuda()) {
    if (const std::optional<int64_t> free = utils::cuda_free_bytes()) {
      available = static_cast<double>(*free);
      where = "free on " + device.str();
    }
  } else if (const std::optional<double> host = host_memory_available()) {
    const int ranks = std::max(1, env.local_world_size);
    available = *host / ranks;
    where = "host memory available" + (ranks > 1 ? " / " + std::to_string(ranks) + " ranks on this node" : "");
  }
  if (!available || estimate.total() <= *available) return;
  throw std::invalid_argument(
      "the model and its training state need an estimated " + utils::describe(estimate) + " per rank, but " +
      format_bytes(*available) + " is " + where +
      "; lower model.hidden_size, model.num_layers, model.seq_length or train.micro_batch_size, or spread the model "
      "over more ranks (parallelism.tensor_model_parallel_size, parallelism.pipeline_model_parallel_size)");
}

int intra_op_threads(const ConfigContainer& config, const parallel::LaunchEnv& env) {
  const int share = std::max(1, available_cores() / std::max(1, env.local_world_size));
  if (config.train.num_threads == 0) return share;
  if (config.train.num_threads <= share) return config.train.num_threads;
  if (parallel::get_rank() == 0) {
    bridge::utils::logger().warn(
        "train.num_threads={} is more than this rank's share of the cores ({} cores / {} ranks on this node): using "
        "{}; more threads than cores only wait on each other",
        config.train.num_threads, available_cores(), env.local_world_size, share);
  }
  return share;
}

}  // namespace

int preflight(const ConfigContainer& config, const torch::Device& device) {
  const int rank = parallel::get_rank();
  const int world_size = parallel::get_world_size();
  const parallel::LaunchEnv& env = parallel::get_launch_env();
  std::string failure;
  try {
    check_input_paths(config);
    check_output_paths(config, rank, world_size);
    check_checkpoint_space(config, world_size, env);
    check_memory(config, world_size, device, env);
  } catch (const std::exception& error) {
    failure = bridge::utils::describe(error);
  }
  const std::vector<std::string> failures = parallel::all_gather_strings(parallel::get_world_group(), failure);
  for (std::size_t source = 0; source < failures.size(); ++source) {
    if (failures[source].empty()) continue;
    throw PreflightError(
        world_size == 1 ? failures[source] : "rank " + std::to_string(source) + ": " + failures[source],
        static_cast<int>(source));
  }
  return intra_op_threads(config, env);
}

}  // namespace bridge::training
