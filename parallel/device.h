// Where a rank computes: the choice of device from the config and the launcher's LOCAL_RANK (Megatron binds
// torch.cuda.set_device(LOCAL_RANK)), the collective backend that goes with it, and the few device calls the
// training loop needs. The choices are pure functions of their arguments, so they are tested without a GPU.
//
//   torch::Device device = select_device("auto", detect_launch_env()).device;
//   bind_device(device);                                       // before any NCCL group or CUDA tensor
//   Backend backend = select_backend(std::nullopt, device, nccl_available());
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "parallel/launch_env.h"
#include "parallel/process_group.h"

namespace bridge::parallel {

/// What a device request resolved to, and why (for the log line when `auto` chose the CPU despite visible GPUs).
struct DeviceSelection {
  torch::Device device = torch::kCPU;
  std::string reason;
};

/// Resolves `requested` for the rank with `local_rank` of `local_world_size` on its node, given the CUDA devices this
/// process sees (`cuda_device_count`) and whether LibTorch was built with CUDA (`cuda_built`):
///   "auto"   -> cuda:<local_rank> when every local rank has its own device, else the CPU (for every local rank
///               alike, so a node never mixes devices);
///   "cuda"   -> cuda:<local_rank>; an error without CUDA or when local_rank >= cuda_device_count;
///   "cuda:N" -> cuda:N whatever the local rank (several ranks may share a GPU over Gloo; NCCL refuses that);
///   "cpu"    -> the CPU.
/// Errors are std::invalid_argument naming `field` and the fix.
DeviceSelection select_device(const std::string& requested, int local_rank, int local_world_size, int cuda_device_count,
                              bool cuda_built, const std::string& field = "parallelism.device");

/// select_device for the rank `env` describes, with the CUDA devices this process sees.
DeviceSelection select_device(const std::string& requested, const LaunchEnv& env,
                              const std::string& field = "parallelism.device");

/// The collective backend: `requested` if set (nccl needs a CUDA device and a LibTorch with NCCL: an error naming
/// `field` otherwise), else NCCL for a CUDA device when LibTorch has NCCL, else Gloo.
Backend select_backend(const std::optional<Backend>& requested, const torch::Device& device, bool nccl_available,
                       const std::string& field = "parallelism.backend");

/// CUDA devices this process sees (0 without CUDA), and whether this LibTorch was built with CUDA and NCCL.
int cuda_device_count();
bool cuda_built();

/// Makes `device` the current CUDA device of this process (torch.cuda.set_device); nothing for the CPU.
void bind_device(const torch::Device& device);
/// Waits until the work queued on `device` is done (torch.cuda.synchronize), so a clock read after it times the
/// work itself and not its launch; nothing for the CPU, whose work is done when the call returns.
void synchronize_device(const torch::Device& device);

}  // namespace bridge::parallel
