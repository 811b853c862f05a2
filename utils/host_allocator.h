// Host-memory settings for training: freed blocks stay in the process for the next step instead of going back to
// the kernel.
//
// A training step allocates and frees the same large blocks (activations, gradients, optimizer temporaries) every
// step. glibc's malloc serves each block over its mmap threshold (at most 32 MiB) with a fresh mmap and unmaps it on
// free, and trims the heap's free top back to the kernel, so every step faults in and zeroes those pages again: ~3 M
// page faults and a fifth of the step for GPT-2 124M on two CPU threads. configure_host_allocator() is what
// MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<large> would do, applied by pretrain() so that nobody has to set them.
#pragma once

#include <string>

namespace bridge::utils {

struct HostAllocatorSettings {
  bool applied = false;  ///< whether malloc now keeps freed blocks in the process
  std::string detail;    ///< what was set, or why nothing was
};

/// Serves every block from malloc's heap (none from its own mmap) and keeps the heap's free top, so that freed
/// blocks are reused without page faults; peak memory is the live peak plus the heap's fragmentation. Does nothing
/// where the user chose malloc's settings (an environment variable user_malloc_setting() names), or where malloc is
/// not glibc's or is replaced (a sanitizer's); `detail` says which. Safe to call more than once.
///
///   const HostAllocatorSettings settings = configure_host_allocator();
///   logger().debug("host allocator: {}", settings.detail);
HostAllocatorSettings configure_host_allocator();

/// The environment variable through which the user set glibc malloc's tuning (MALLOC_MMAP_MAX_, MALLOC_TRIM_THRESHOLD_,
/// MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_, or GLIBC_TUNABLES with glibc.malloc.*), or "" if none.
std::string user_malloc_setting();

}  // namespace bridge::utils
