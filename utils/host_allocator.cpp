// configure_host_allocator: glibc's mallopt with M_MMAP_MAX 0, the largest M_TRIM_THRESHOLD and M_ARENA_MAX 1, and
// HostCpuAllocator as LibTorch's CPU allocator, unless the user set malloc's tuning in the environment;
// zeros_outside_heap's anonymous mappings.
#include "utils/host_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <system_error>

#ifdef __GLIBC__
#include <malloc.h>
#endif

// A sanitizer's runtime brings its own allocator, which glibc's mallopt does not tune (ThreadSanitizer's even lets
// mallopt answer 1 for glibc's unused heap).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BRIDGE_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define BRIDGE_SANITIZER_ALLOCATOR 1
#endif
#endif

namespace bridge::utils {
namespace {

// LibTorch's CPU allocator with c10's 64-byte alignment made inside a plain malloc block (c10's own asks
// posix_memalign, whose split-off tail fragments the heap; see the header). The block's start is kept in the 8 bytes
// before the data, so a data pointer alone frees it, as raw_allocate/raw_deleter need. Unlike c10's it reports
// nothing to the profiler's CPU memory events.
class HostCpuAllocator final : public c10::Allocator {
 public:
  static constexpr std::uintptr_t kAlignment = 64;

  static void* allocate_bytes(std::size_t bytes) {
    if (bytes == 0) return nullptr;  // as c10's
    void* block = std::malloc(bytes + kAlignment + sizeof(void*));
    if (block == nullptr) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "HostCpuAllocator: not enough memory: you tried to allocate ", bytes,
                       " bytes");
    }
    const auto start = reinterpret_cast<std::uintptr_t>(block);
    const std::uintptr_t data = (start + sizeof(void*) + kAlignment - 1) & ~(kAlignment - 1);
    reinterpret_cast<void**>(data)[-1] = block;
    return reinterpret_cast<void*>(data);
  }

  static void release(void* data) {
    if (data != nullptr) std::free(static_cast<void**>(data)[-1]);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t bytes) override { return make(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(size_t bytes) const override { return make(bytes); }
#endif

 private:
  static c10::DataPtr make(std::size_t bytes) {
    void* data = allocate_bytes(bytes);
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
};

// Leaked on purpose: storages freed during static destruction still call its deleter.
HostCpuAllocator& host_cpu_allocator() {
  static auto* allocator = new HostCpuAllocator;
  return *allocator;
}

// Makes HostCpuAllocator LibTorch's CPU allocator where LibTorch's default is in place; says what it did.
std::string install_host_cpu_allocator() {
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current == &host_cpu_allocator()) return "bridge's CPU allocator";
  if (current != c10::GetDefaultCPUAllocator()) return "the CPU allocator in place (not LibTorch's default) kept";
  // A priority above the default one (0), as CountingCpuAllocator's: installed after this one, it wraps it.
  c10::SetCPUAllocator(&host_cpu_allocator(), /*priority=*/1);
  return "bridge's CPU allocator";
}

}  // namespace

std::string user_malloc_setting() {
  for (const char* name : {"MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                           "MALLOC_ARENA_MAX"}) {
    if (std::getenv(name) != nullptr) return name;
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::string_view(tunables).find("glibc.malloc.") != std::string_view::npos) {
    return "GLIBC_TUNABLES";
  }
  return "";
}

HostAllocatorSettings configure_host_allocator() {
  HostAllocatorSettings settings;
  const std::string user = user_malloc_setting();
  if (!user.empty()) {
    settings.detail = "left as the environment sets it (" + user + ")";
    return settings;
  }
#if defined(BRIDGE_SANITIZER_ALLOCATOR)
  settings.detail = "not applied: a sanitizer's allocator replaces glibc's malloc in this build";
#elif defined(__GLIBC__)
  // mallopt answers 1 when it took the value; a malloc that replaces glibc's (a sanitizer's) answers otherwise.
  // M_TRIM_THRESHOLD is an int: INT_MAX keeps up to 2 GiB of free heap top, far beyond a step's transient blocks.
  // M_ARENA_MAX counts from threads that allocate after it; the process groups' threads start later.
  if (mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1 && mallopt(M_ARENA_MAX, 1) == 1) {
    settings.applied = true;
    settings.detail = "glibc malloc keeps freed blocks (M_MMAP_MAX 0, M_TRIM_THRESHOLD 2 GiB, M_ARENA_MAX 1), " +
                      install_host_cpu_allocator();
  } else {
    settings.detail = "not applied: this process's malloc does not take glibc's mallopt settings";
  }
#else
  settings.detail = "not applied: malloc is not glibc's";
#endif
  return settings;
}

torch::Tensor zeros_outside_heap(int64_t numel, const torch::TensorOptions& options) {
  if (!options.device().is_cpu() || numel == 0) return torch::zeros({numel}, options);
  const std::size_t bytes = static_cast<std::size_t>(numel) * options.dtype().itemsize();
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    throw std::system_error(
        errno, std::generic_category(),
        "zeros_outside_heap: mapping " + std::to_string(bytes) + " bytes for " + std::to_string(numel) + " elements");
  }
  return torch::from_blob(
      data, {numel}, [bytes](void* mapped) { munmap(mapped, bytes); }, options);
}

}  // namespace bridge::utils
