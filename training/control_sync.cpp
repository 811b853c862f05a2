// agree_on_control: request flags summed over the world, then the requests' descriptions gathered from every rank.
#include "training/control_sync.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace bridge::training {
namespace {

std::string describe(const ControlRequest& request, int rank) {
  return "rank " + std::to_string(rank) + ": callback '" + request.callback + "' asked to " +
         std::string(to_string(request.action)) + " during " + std::string(to_string(request.event)) + ": " +
         request.reason + "\n";
}

}  // namespace

AgreedControl agree_on_control(TrainingControl* control, parallel::ProcessGroup& world) {
  const std::vector<ControlRequest> requests = control != nullptr ? control->take() : std::vector<ControlRequest>{};
  torch::Tensor counts = torch::zeros({3}, torch::kLong);
  for (const ControlRequest& request : requests) counts[static_cast<int64_t>(request.action)] += 1;
  world.all_reduce(counts);
  AgreedControl agreed;
  agreed.stop = counts[static_cast<int64_t>(ControlAction::kStop)].item<int64_t>() > 0;
  agreed.save = counts[static_cast<int64_t>(ControlAction::kSave)].item<int64_t>() > 0;
  agreed.abort = counts[static_cast<int64_t>(ControlAction::kAbort)].item<int64_t>() > 0;
  if (!agreed.any()) return agreed;

  // Someone asked: gather everyone's descriptions as equal-length byte tensors.
  std::string mine;
  for (const ControlRequest& request : requests) mine += describe(request, world.global_ranks()[world.rank()]);
  torch::Tensor length = torch::tensor({static_cast<int64_t>(mine.size())}, torch::kLong);
  world.all_reduce(length, parallel::ReduceOp::kMax);
  torch::Tensor bytes = torch::zeros({std::max<int64_t>(1, length.item<int64_t>())}, torch::kUInt8);
  std::memcpy(bytes.data_ptr<uint8_t>(), mine.data(), mine.size());
  for (const torch::Tensor& text : world.all_gather(bytes)) {
    const char* data = reinterpret_cast<const char*>(text.data_ptr<uint8_t>());
    agreed.summary.append(data, strnlen(data, static_cast<std::size_t>(text.numel())));
  }
  return agreed;
}

}  // namespace bridge::training
