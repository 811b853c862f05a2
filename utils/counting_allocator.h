// The bytes of live CPU tensors, counted: a c10::Allocator in front of LibTorch's CPU allocator that adds each
// allocation's size while its tensor storage lives. What a step really holds, apart from what malloc keeps around
// (resident memory also counts freed blocks the heap has not returned, and LibTorch's code). The memory benchmark
// compares its peak with the preflight's prediction.
//
//   utils::CountingCpuAllocator& counter = utils::CountingCpuAllocator::install();
//   counter.reset_peak();
//   run_step();
//   std::printf("%.0f MB\n", counter.peak_bytes() / 1e6);
#pragma once

#include <c10/core/Allocator.h>
#include <torch/version.h>

#include <atomic>
#include <cstdint>

namespace bridge::utils {

class CountingCpuAllocator final : public c10::Allocator {
 public:
  /// Puts the process's counter in front of the current CPU allocator (once; later calls return it). Tensors
  /// allocated before are not counted, and freeing them does not uncount anything.
  static CountingCpuAllocator& install();

  /// Bytes of CPU storages allocated through it and not yet freed.
  int64_t allocated_bytes() const { return allocated_.load(std::memory_order_relaxed); }
  /// The most allocated_bytes() has been since install() or the last reset_peak().
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  /// Starts a new peak from what is allocated now.
  void reset_peak() { peak_.store(allocated_bytes(), std::memory_order_relaxed); }

#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t bytes) override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;
#else
  c10::DataPtr allocate(size_t bytes) const override;
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

 private:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr counted(size_t bytes) const;
  void add(int64_t bytes) const;
  static void release(void* data);

  c10::Allocator* inner_;
  mutable std::atomic<int64_t> allocated_{0};
  mutable std::atomic<int64_t> peak_{0};
};

}  // namespace bridge::utils
