// Host-memory settings for training: freed blocks stay in the process for the next step instead of going back to
// the kernel, and are reused in place rather than walking the heap up.
//
// A training step allocates and frees the same large blocks (activations, gradients, optimizer temporaries) every
// step. glibc's malloc serves each block over its mmap threshold (at most 32 MiB) with a fresh mmap and unmaps it on
// free, and trims the heap's free top back to the kernel, so every step faults in and zeroes those pages again: ~3 M
// page faults and a fifth of the step for GPT-2 124M on two CPU threads. configure_host_allocator() is what
// MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<large> MALLOC_ARENA_MAX=1 would do, applied by pretrain() so that nobody
// has to set them, plus a CPU allocator for LibTorch that takes its blocks from malloc rather than posix_memalign.
//
// Serving every block from the heap makes the heap's fragmentation the resident memory; three things fragmented it
// (measured for 8 layers x 768 at dp 2: the distributed optimizer's saving of 218 MiB a rank was 10-120 MiB in
// resident memory):
// - posix_memalign asks malloc for the size plus the alignment plus 32 bytes and returns the spare tail to the free
//   lists, where small allocations take it. A freed block's hole is then too small by those bytes for the next block
//   of the same size, which comes from the top: each step's transients walked up the heap. HostCpuAllocator aligns
//   inside a plain malloc block instead, so a freed block is reused whole by the next of its size.
// - every thread that allocates gets an arena of its own (up to 8 a core), and an arena's free memory is reused only
//   by its threads: Gloo's worker threads kept 35 MiB each of staging that the main heap could not reuse. One arena
//   for all.
// - long-lived buffers made among the step's transients pin the heap around them: zeros_outside_heap() gives them an
//   anonymous mapping of their own.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace bridge::utils {

struct HostAllocatorSettings {
  bool applied = false;  ///< whether malloc now keeps freed blocks in the process
  std::string detail;    ///< what was set, or why nothing was
};

/// Serves every block from malloc's heap (none from its own mmap), keeps the heap's free top, uses one arena for
/// every thread, and makes LibTorch's CPU tensors come from plain malloc blocks (HostCpuAllocator), so that freed
/// blocks are reused in place without page faults; peak memory is the live peak plus the heap's fragmentation. Does
/// nothing where the user chose malloc's settings (an environment variable user_malloc_setting() names), or where
/// malloc is not glibc's or is replaced (a sanitizer's); `detail` says which. The CPU allocator is left alone where
/// another than LibTorch's default is in place (install this one first: utils::CountingCpuAllocator then counts on
/// top of it). Safe to call more than once.
///
///   const HostAllocatorSettings settings = configure_host_allocator();
///   logger().debug("host allocator: {}", settings.detail);
HostAllocatorSettings configure_host_allocator();

/// The environment variable through which the user set glibc malloc's tuning (MALLOC_MMAP_MAX_, MALLOC_TRIM_THRESHOLD_,
/// MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_ARENA_MAX, or GLIBC_TUNABLES with glibc.malloc.*), or "" if none.
std::string user_malloc_setting();

/// `numel` zeros of `options` for a buffer that lives as long as the model (DistributedDataParallel's grad and param
/// buffers): on the CPU in an anonymous mapping of their own, outside malloc's heap, so the heap holds only what
/// comes and goes and reuses it (and the pages are the kernel's zeros, touched when first written); on other devices
/// torch::zeros. Freed with its last view.
torch::Tensor zeros_outside_heap(int64_t numel, const torch::TensorOptions& options);

}  // namespace bridge::utils
