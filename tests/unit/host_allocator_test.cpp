// configure_host_allocator: after it, a large block freed and allocated again is served without fresh page faults
// (glibc's default unmaps it on free and faults every page in again); the user's own malloc settings win.
#include "utils/host_allocator.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>

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

}  // namespace
}  // namespace bridge::utils
