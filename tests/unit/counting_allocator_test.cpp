// CountingCpuAllocator: the bytes of live CPU storages and their peak, exactly, for tensors made after it is installed;
// the tensors it hands out hold working memory.
#include "utils/counting_allocator.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

namespace bridge::utils {
namespace {

TEST(CountingCpuAllocator, CountsTheBytesOfLiveStoragesAndTheirPeak) {
  CountingCpuAllocator& counter = CountingCpuAllocator::install();
  EXPECT_EQ(&counter, &CountingCpuAllocator::install());
  const int64_t base = counter.allocated_bytes();
  counter.reset_peak();
  {
    const torch::Tensor a = torch::empty({1000}, torch::kFloat32);
    EXPECT_EQ(counter.allocated_bytes() - base, 4000);
    {
      const torch::Tensor b = torch::empty({250}, torch::kFloat64);
      const torch::Tensor view = b.narrow(0, 10, 20);  // a view allocates nothing
      EXPECT_EQ(counter.allocated_bytes() - base, 6000);
    }
    EXPECT_EQ(counter.allocated_bytes() - base, 4000);
    torch::Tensor c = torch::empty({3000}, torch::kUInt8);
    EXPECT_EQ(counter.allocated_bytes() - base, 7000);
    std::thread([c = std::move(c)]() mutable { c = torch::Tensor(); }).join();  // freed on another thread
    EXPECT_EQ(counter.allocated_bytes() - base, 4000);
  }
  EXPECT_EQ(counter.allocated_bytes(), base);
  EXPECT_EQ(counter.peak_bytes() - base, 7000);
  counter.reset_peak();
  EXPECT_EQ(counter.peak_bytes(), counter.allocated_bytes());
  // LibTorch's kernels also take scratch buffers as bare pointers (raw_allocate, freed through raw_deleter).
  void* scratch = counter.raw_allocate(100);
  EXPECT_EQ(counter.allocated_bytes() - base, 100);
  counter.raw_deleter()(scratch);
  EXPECT_EQ(counter.allocated_bytes(), base);
  // The memory is the inner allocator's, usable as any tensor's.
  const torch::Tensor x = torch::arange(1000, torch::kInt64);
  EXPECT_EQ(x.sum().item<int64_t>(), 499500);
  EXPECT_EQ(x.clone().index({999}).item<int64_t>(), 999);
}

}  // namespace
}  // namespace bridge::utils
