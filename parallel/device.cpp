// Device and backend selection (device.h). Only LibTorch's device-generic calls are used, so this file compiles the
// same against CPU-only and CUDA LibTorch.
#include "parallel/device.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <stdexcept>

#include "parallel/c10d_backend.h"

namespace bridge::parallel {
namespace {

std::invalid_argument device_error(const std::string& field, const std::string& requested, const std::string& why) {
  return std::invalid_argument(field + " '" + requested + "': " + why);
}

}  // namespace

DeviceSelection select_device(const std::string& requested, int local_rank, int local_world_size, int cuda_device_count,
                              bool cuda_built, const std::string& field) {
  const std::string count = std::to_string(cuda_device_count);
  if (requested == "cpu") return {torch::kCPU, "requested"};
  if (requested == "auto") {
    if (cuda_device_count == 0) {
      return {torch::kCPU, cuda_built ? "no CUDA device is visible" : "this LibTorch has no CUDA"};
    }
    if (local_world_size > cuda_device_count) {
      return {torch::kCPU, std::to_string(local_world_size) + " ranks on this node but " + count +
                               " CUDA device(s); set " + field + "=cuda:0 to share one over gloo"};
    }
    return {torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank)), "LOCAL_RANK"};
  }
  if (requested.rfind("cuda", 0) != 0) {
    throw device_error(field, requested, "unknown device; use auto, cuda, cuda:<index> or cpu");
  }
  if (!cuda_built) {
    throw device_error(field, requested,
                       "this LibTorch was built without CUDA; use cpu, or build against a CUDA LibTorch");
  }
  if (cuda_device_count == 0) {
    throw device_error(field, requested,
                       "no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES), or use cpu");
  }
  int index = local_rank;
  if (requested != "cuda") {
    const std::string digits = requested.size() > 5 && requested[4] == ':' ? requested.substr(5) : "";
    if (digits.empty() || digits.size() > 4 || digits.find_first_not_of("0123456789") != std::string::npos) {
      throw device_error(field, requested, "expected cuda or cuda:<index>, e.g. cuda:0");
    }
    index = std::stoi(digits);
    if (index >= cuda_device_count) {
      throw device_error(field, requested,
                         "device index " + digits + " but only " + count + " CUDA device(s) are visible");
    }
  } else if (local_rank >= cuda_device_count) {
    throw device_error(field, requested,
                       "LOCAL_RANK " + std::to_string(local_rank) + " has no device of its own (" + count +
                           " visible); launch at most " + count + " ranks per node, or set " + field +
                           "=cuda:0 with parallelism.backend=gloo to share one");
  }
  return {torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index)), "requested"};
}

DeviceSelection select_device(const std::string& requested, const LaunchEnv& env, const std::string& field) {
  return select_device(requested, env.local_rank, env.local_world_size, cuda_device_count(), cuda_built(), field);
}

Backend select_backend(const std::optional<Backend>& requested, const torch::Device& device, bool nccl_available,
                       const std::string& field) {
  if (!requested) return device.is_cuda() && nccl_available ? Backend::kNccl : Backend::kGloo;
  if (*requested == Backend::kNccl) {
    if (!nccl_available) {
      throw std::invalid_argument(field + " 'nccl': this LibTorch has no CUDA and NCCL; use gloo");
    }
    if (!device.is_cuda()) {
      throw std::invalid_argument(field + " 'nccl': NCCL needs CUDA tensors but this rank's device is " + device.str() +
                                  "; set parallelism.device to cuda, or use gloo");
    }
  }
  return *requested;
}

int cuda_device_count() { return static_cast<int>(torch::cuda::device_count()); }

bool cuda_built() { return detail::nccl_available(); }

void bind_device(const torch::Device& device) {
  if (!device.is_cuda()) return;
  c10::impl::getDeviceGuardImpl(device.type())->setDevice(device);
}

void synchronize_device(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

}  // namespace bridge::parallel
