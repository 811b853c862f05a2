// The CUDA caching allocator's statistics under PyTorch's torch.cuda.memory_stats() names, for report_memory. Compiled
// against CUDA only when LibTorch has it (BRIDGE_WITH_CUDA); elsewhere there are none.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace bridge::training::utils {

/// Whether this LibTorch has CUDA and a device is visible.
bool cuda_memory_stats_available();

/// The current device's "allocated_bytes.all.current", "...peak", "active_bytes.*", "inactive_split_bytes.*",
/// "reserved_bytes.*", "allocation.all.current" and "num_alloc_retries"; empty without CUDA.
std::map<std::string, int64_t> cuda_memory_stats();

/// The current CUDA device's name ("NVIDIA H100 80GB HBM3"); nullopt without CUDA. Here because this is the one
/// file compiled against CUDA.
std::optional<std::string> cuda_device_name();

/// Bytes free on the current CUDA device (cudaMemGetInfo); nullopt without CUDA.
std::optional<int64_t> cuda_free_bytes();

}  // namespace bridge::training::utils
