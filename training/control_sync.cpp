// agree_on_control: request flags summed over the world, then the requests' descriptions gathered from every rank.
#include "training/control_sync.h"

namespace bridge::training {
namespace {

std::string describe(const ControlRequest& request, int rank) {
  return "rank " + std::to_string(rank) + ": callback '" + request.callback + "' asked to " +
         std::string(to_string(request.action)) + " during " + std::string(to_string(request.event)) + ": " +
         request.reason + "\n";
}

}  // namespace

void AgreedControl::merge(const AgreedControl& other) {
  stop = stop || other.stop;
  save = save || other.save;
  abort = abort || other.abort;
  summary += other.summary;
}

std::array<int64_t, 3> count_requests(const std::vector<ControlRequest>& requests) {
  std::array<int64_t, 3> counts{};
  for (const ControlRequest& request : requests) counts[static_cast<std::size_t>(request.action)] += 1;
  return counts;
}

AgreedControl agree_on_control(TrainingControl* control, parallel::ProcessGroup& world) {
  const std::vector<ControlRequest> requests = control != nullptr ? control->take() : std::vector<ControlRequest>{};
  const std::array<int64_t, 3> mine = count_requests(requests);
  torch::Tensor counts = torch::tensor({mine[0], mine[1], mine[2]}, torch::kLong);
  world.all_reduce(counts);
  return agree_on_control(requests, {counts[0].item<int64_t>(), counts[1].item<int64_t>(), counts[2].item<int64_t>()},
                          world);
}

AgreedControl agree_on_control(const std::vector<ControlRequest>& requests, const std::array<int64_t, 3>& world_counts,
                               parallel::ProcessGroup& world) {
  AgreedControl agreed;
  agreed.stop = world_counts[static_cast<std::size_t>(ControlAction::kStop)] > 0;
  agreed.save = world_counts[static_cast<std::size_t>(ControlAction::kSave)] > 0;
  agreed.abort = world_counts[static_cast<std::size_t>(ControlAction::kAbort)] > 0;
  if (!agreed.any()) return agreed;

  // Someone asked: gather everyone's descriptions.
  std::string mine;
  for (const ControlRequest& request : requests) mine += describe(request, world.global_ranks()[world.rank()]);
  for (const std::string& text : parallel::all_gather_strings(world, mine)) agreed.summary += text;
  return agreed;
}

}  // namespace bridge::training
