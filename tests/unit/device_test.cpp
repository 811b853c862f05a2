// select_device and select_backend: the device and collective backend each rank gets from parallelism.device,
// parallelism.backend and the launcher's LOCAL_RANK, for machines with and without CUDA (pure functions: no GPU
// needed). Also the device helpers on the CPU.
#include "parallel/device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

namespace bridge::parallel {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

torch::Device cuda(int index) { return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index)); }

TEST(SelectDevice, AutoBindsLocalRankWhenEveryLocalRankHasAGpu) {
  EXPECT_EQ(select_device("auto", 0, 1, 1, true).device, cuda(0));
  EXPECT_EQ(select_device("auto", 3, 8, 8, true).device, cuda(3));
  EXPECT_EQ(select_device("auto", 1, 2, 4, true).device, cuda(1));
}

TEST(SelectDevice, AutoFallsBackToTheCpuForTheWholeNode) {
  const DeviceSelection no_cuda = select_device("auto", 0, 1, 0, false);
  EXPECT_TRUE(no_cuda.device.is_cpu());
  EXPECT_THAT(no_cuda.reason, HasSubstr("no CUDA"));
  EXPECT_TRUE(select_device("auto", 0, 1, 0, true).device.is_cpu());
  // More ranks than GPUs: every local rank, including those that would have a GPU, takes the CPU.
  for (int local_rank = 0; local_rank < 4; ++local_rank) {
    const DeviceSelection shared = select_device("auto", local_rank, 4, 1, true);
    EXPECT_TRUE(shared.device.is_cpu());
    EXPECT_THAT(shared.reason, HasSubstr("cuda:0"));
  }
}

TEST(SelectDevice, ExplicitChoices) {
  EXPECT_TRUE(select_device("cpu", 5, 8, 8, true).device.is_cpu());
  EXPECT_TRUE(select_device("cpu", 0, 1, 0, false).device.is_cpu());
  EXPECT_EQ(select_device("cuda", 2, 4, 4, true).device, cuda(2));
  // cuda:N ignores LOCAL_RANK: several ranks may share one GPU (over gloo).
  EXPECT_EQ(select_device("cuda:0", 1, 2, 1, true).device, cuda(0));
  EXPECT_EQ(select_device("cuda:3", 0, 1, 4, true).device, cuda(3));
}

TEST(SelectDevice, ErrorsNameTheFieldAndTheFix) {
  EXPECT_THAT([] { select_device("cuda", 0, 1, 0, false); },
              ThrowsMessage<std::invalid_argument>(
                  AllOf(HasSubstr("parallelism.device 'cuda'"), HasSubstr("built without CUDA"))));
  EXPECT_THAT([] { select_device("cuda", 0, 1, 0, true); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("no CUDA device is visible")));
  EXPECT_THAT([] { select_device("cuda", 2, 4, 2, true); },
              ThrowsMessage<std::invalid_argument>(
                  AllOf(HasSubstr("LOCAL_RANK 2 has no device of its own (2 visible)"), HasSubstr("cuda:0"))));
  EXPECT_THAT([] { select_device("cuda:2", 0, 1, 2, true); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("only 2 CUDA device(s)")));
  for (const char* bad : {"cuda:", "cuda:x", "cuda:-1", "cuda0", "cudax", "cuda:00000"}) {
    EXPECT_THAT([&] { select_device(bad, 0, 1, 1, true); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("expected cuda or cuda:<index>")))
        << bad;
  }
  EXPECT_THAT([] { select_device("gpu", 0, 1, 1, true); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("use auto, cuda, cuda:<index> or cpu")));
  EXPECT_THAT([] { select_device("tpu", 0, 1, 1, true, "train.device"); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("train.device 'tpu'")));
}

TEST(SelectBackend, AutoIsNcclForCudaWithNcclElseGloo) {
  EXPECT_EQ(select_backend(std::nullopt, cuda(0), true), Backend::kNccl);
  EXPECT_EQ(select_backend(std::nullopt, cuda(0), false), Backend::kGloo);
  EXPECT_EQ(select_backend(std::nullopt, torch::kCPU, true), Backend::kGloo);
  EXPECT_EQ(select_backend(std::nullopt, torch::kCPU, false), Backend::kGloo);
}

TEST(SelectBackend, ExplicitChoices) {
  // Gloo takes CUDA tensors too (ranks sharing a GPU).
  EXPECT_EQ(select_backend(Backend::kGloo, cuda(0), true), Backend::kGloo);
  EXPECT_EQ(select_backend(Backend::kGloo, torch::kCPU, false), Backend::kGloo);
  EXPECT_EQ(select_backend(Backend::kNccl, cuda(1), true), Backend::kNccl);
  EXPECT_THAT(
      [] { select_backend(Backend::kNccl, torch::kCPU, true); },
      ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("parallelism.backend 'nccl'"), HasSubstr("device is cpu"))));
  EXPECT_THAT([] { select_backend(Backend::kNccl, cuda(0), false); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("no CUDA and NCCL; use gloo")));
}

TEST(DeviceHelpers, CpuIsANoOp) {
  EXPECT_NO_THROW(bind_device(torch::kCPU));
  EXPECT_NO_THROW(synchronize_device(torch::kCPU));
  EXPECT_GE(cuda_device_count(), 0);
  // The process's own devices: without a GPU, "auto" is the CPU and "cuda" an error.
  if (cuda_device_count() == 0) {
    EXPECT_TRUE(select_device("auto", LaunchEnv{}).device.is_cpu());
    EXPECT_THROW(select_device("cuda", LaunchEnv{}), std::invalid_argument);
  }
}

}  // namespace
}  // namespace bridge::parallel
