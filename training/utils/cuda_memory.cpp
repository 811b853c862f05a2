// cuda_memory: reads c10's CUDA caching allocator. Only the aggregate pool (index 0, StatType::AGGREGATE) is read, by
// index, because the StatType enum moved namespaces between LibTorch 1.x and 2.x while the fields kept their names.
#include "training/utils/cuda_memory.h"

#include <torch/torch.h>

#ifdef BRIDGE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/version.h>
#endif

namespace bridge::training::utils {

bool cuda_memory_stats_available() {
#ifdef BRIDGE_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

std::map<std::string, int64_t> cuda_memory_stats() {
  std::map<std::string, int64_t> stats;
#ifdef BRIDGE_WITH_CUDA
  if (!torch::cuda::is_available()) return stats;
  // The current device is this rank's: pretrain() binds it (parallel::bind_device) before building anything.
  const auto device = c10::cuda::current_device();
  const auto device_stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  constexpr std::size_t kAggregate = 0;
#if TORCH_VERSION_MAJOR >= 2
  static_assert(static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE) == kAggregate);
#endif
  const auto add = [&](const std::string& name, const auto& stat) {
    stats[name + ".all.current"] = stat[kAggregate].current;
    stats[name + ".all.peak"] = stat[kAggregate].peak;
  };
  add("allocated_bytes", device_stats.allocated_bytes);
  add("active_bytes", device_stats.active_bytes);
  add("inactive_split_bytes", device_stats.inactive_split_bytes);
  add("reserved_bytes", device_stats.reserved_bytes);
  add("allocation", device_stats.allocation);
  stats["num_alloc_retries"] = device_stats.num_alloc_retries;
#endif
  return stats;
}

std::optional<std::string> cuda_device_name() {
#ifdef BRIDGE_WITH_CUDA
  if (!torch::cuda::is_available()) return std::nullopt;
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, c10::cuda::current_device()) != cudaSuccess) return std::nullopt;
  return std::string(properties.name);
#else
  return std::nullopt;
#endif
}

std::optional<int64_t> cuda_free_bytes() {
#ifdef BRIDGE_WITH_CUDA
  if (!torch::cuda::is_available()) return std::nullopt;
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return std::nullopt;
  return static_cast<int64_t>(free);
#else
  return std::nullopt;
#endif
}

}  // namespace bridge::training::utils
