// CountingCpuAllocator: each allocation takes a 64-byte header from the inner allocator (keeping c10's 64-byte
// alignment) that holds its size, so a data pointer alone frees it and uncounts it. That is what LibTorch's
// raw_allocate/raw_deleter need (some kernels allocate their scratch buffers through them), which rules out a
// context object beside the data.
#include "utils/counting_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <stdexcept>

namespace bridge::utils {
namespace {

constexpr std::size_t kHeader = 64;

CountingCpuAllocator* g_counter = nullptr;
c10::DeleterFnPtr g_inner_free = nullptr;

}  // namespace

CountingCpuAllocator& CountingCpuAllocator::install() {
  // Leaked on purpose: storages freed during static destruction still call its deleter.
  static CountingCpuAllocator* const counter = [] {
    c10::Allocator* inner = c10::GetCPUAllocator();
    g_inner_free = inner->raw_deleter();
    if (g_inner_free == nullptr) {
      throw std::logic_error("CountingCpuAllocator: the CPU allocator in place cannot free a bare pointer");
    }
    g_counter = new CountingCpuAllocator(inner);
    // A priority above the default one (0), so LibTorch's own registration cannot replace it later.
    c10::SetCPUAllocator(g_counter, /*priority=*/1);
    return g_counter;
  }();
  return *counter;
}

void CountingCpuAllocator::add(int64_t bytes) const {
  const int64_t now = allocated_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void CountingCpuAllocator::release(void* data) {
  char* base = static_cast<char*>(data) - kHeader;
  g_counter->add(-*reinterpret_cast<int64_t*>(base));
  g_inner_free(base);
}

c10::DataPtr CountingCpuAllocator::counted(size_t bytes) const {
  auto* base = static_cast<char*>(inner_->raw_allocate(bytes + kHeader));
  *reinterpret_cast<int64_t*>(base) = static_cast<int64_t>(bytes);
  add(static_cast<int64_t>(bytes));
  void* data = base + kHeader;
  return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
}

#if TORCH_VERSION_MAJOR >= 2
c10::DataPtr CountingCpuAllocator::allocate(size_t bytes) { return counted(bytes); }
void CountingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}
#else
c10::DataPtr CountingCpuAllocator::allocate(size_t bytes) const { return counted(bytes); }
#endif

}  // namespace bridge::utils
