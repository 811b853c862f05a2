// configure_host_allocator: after it, a large block freed and allocated again is served without fresh page faults
// (glibc's default unmaps it on free and faults every page in again), a freed tensor's block serves the next tensor
// of its size, and zeros_outside_heap's buffers are zeros outside the heap; the user's own malloc settings win.
#include "utils/host_allocator.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <string>

namespace bridge::utils {
namespace {

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Minor page faults taken while a 64 MiB block is allocated, written through and freed.
long faults_for_a_large_block() {
  constexpr std::size_t kBytes = 64UL << 20;
  const long before = minor_faults();
  auto* block = static_cast<char*>(std::malloc(kBytes));
  if (block == nullptr) throw std::bad_alloc();
  // Volatile writes, one per page: a memset into a block that is freed right after may be optimised away.
  volatile char* pages = block;
  for (std::size_t offset = 0; offset < kBytes; offset += 4096) pages[offset] = 1;
  std::free(block);
  return minor_faults() - before;
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, /*overwrite=*/1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

TEST(HostAllocator, UserSettingsInTheEnvironmentWin) {
  ASSERT_EQ(user_malloc_setting(), "") << "run this test without MALLOC_* / GLIBC_TUNABLES malloc settings";
  {
    ScopedEnv env("MALLOC_TRIM_THRESHOLD_", "1000000");
    EXPECT_EQ(user_malloc_setting(), "MALLOC_TRIM_THRESHOLD_");
    const HostAllocatorSettings settings = configure_host_allocator();
    EXPECT_FALSE(settings.applied);
    EXPECT_NE(settings.detail.find("MALLOC_TRIM_THRESHOLD_"), std::string::npos) << settings.detail;
  }
  {
    ScopedEnv env("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=1000:glibc.malloc.mmap_max=0");
    EXPECT_EQ(user_malloc_setting(), "GLIBC_TUNABLES");
  }
  {
    ScopedEnv env("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=1000");  // not malloc's
    EXPECT_EQ(user_malloc_setting(), "");
  }
}

TEST(HostAllocator, ReusesALargeFreedBlockWithoutPageFaults) {
  constexpr long kPages = (64L << 20) / 4096;
  const HostAllocatorSettings settings = configure_host_allocator();
  if (!settings.applied) GTEST_SKIP() << settings.detail;
  faults_for_a_large_block();  // the heap grows once
  const long again = faults_for_a_large_block();
  EXPECT_LT(again, kPages / 16) << "a 64 MiB block freed and allocated again faulted in " << again
                                << " pages: malloc gave it back to the kernel (" << settings.detail << ")";
  EXPECT_TRUE(configure_host_allocator().applied);  // a second call is harmless
}

// c10's own CPU allocator asks posix_memalign, which returns the spare tail of each block to the free lists: once
// something small sits after a block, its hole is too short for the next block of the same size, and each step's
// blocks walked up the heap (the distributed optimizer's saving was lost in resident memory). Blocks larger than any
// free chunk the earlier tests left, so both come from the heap's top, one after the other.
TEST(HostAllocator, AFreedTensorsBlockServesTheNextTensorOfItsSize) {
  const HostAllocatorSettings settings = configure_host_allocator();
  if (!settings.applied) GTEST_SKIP() << settings.detail;
  if (settings.detail.find("bridge's CPU allocator") == std::string::npos) GTEST_SKIP() << settings.detail;
  constexpr int64_t kElements = int64_t{24} << 20;  // 96 MiB of fp32, never written: no page is touched
  torch::Tensor first = torch::empty({kElements});
  const torch::Tensor after = torch::empty({kElements});  // keeps the first block's hole from joining the free top
  void* const address = first.data_ptr();
  first = torch::Tensor();
  const torch::Tensor next = torch::empty({kElements});
  EXPECT_EQ(next.data_ptr(), address) << "a tensor of a freed tensor's size did not take its block (" << settings.detail
                                      << ")";
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(next.data_ptr()) % 64, 0u) << "c10's 64-byte alignment";
}

TEST(HostAllocator, ZerosOutsideHeapAreZerosOfTheDtypeAndFreedWithTheirLastView) {
  for (const torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat64}) {
    torch::Tensor buffer = zeros_outside_heap(int64_t{3} << 20, torch::TensorOptions().dtype(dtype));
    ASSERT_EQ(buffer.dtype(), dtype);
    ASSERT_EQ(buffer.numel(), int64_t{3} << 20);
    EXPECT_EQ(buffer.count_nonzero().item<int64_t>(), 0);
    torch::Tensor view = buffer.narrow(0, 100, 10);
    buffer = torch::Tensor();
    view.fill_(2);  // the mapping lives while a view does
    EXPECT_EQ(view.sum().item<double>(), 20.0);
  }
  EXPECT_EQ(zeros_outside_heap(0, torch::TensorOptions()).numel(), 0);
}

}  // namespace
}  // namespace bridge::utils
