// agree_on_control: request flags summed over the world, then the requests' descriptions gathered from every rank.
#include "training/callbacks/control_sync.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

std::string describe(const ControlRequest& request, int rank) {
  // The loop's own exits name their setting: "rank 3: train.exit_signal_handler: SIGTERM received".
  if (request.action == ControlAction::kExit) {
    return "rank " + std::to_string(rank) + ": " + request.callback + ": " + request.reason + "\n";
  }
  return "rank " + std::to_string(rank) + ": callback '" + request.callback + "' asked to " +
         std::string(to_string(request.action)) + " during " + std::string(to_string(request.event)) + ": " +
         request.reason + "\n";
}

}  // namespace

void AgreedControl::merge(const AgreedControl& other) {
  stop = stop || other.stop;
  save = save || other.save;
  abort = abort || other.abort;
  exit = exit || other.exit;
  summary += other.summary;
}

ControlCounts count_requests(const std::vector<ControlRequest>& requests) {
  ControlCounts counts{};
  for (const ControlRequest& request : requests) counts[static_cast<std::size_t>(request.action)] += 1;
  return counts;
}

AgreedControl agree_on_control(TrainingControl* control, parallel::ProcessGroup& world) {
  const std::vector<ControlRequest> requests = control != nullptr ? control->take() : std::vector<ControlRequest>{};
  ControlCounts counts = count_requests(requests);
  torch::Tensor shared = torch::from_blob(counts.data(), {static_cast<int64_t>(counts.size())}, torch::kLong).clone();
  world.all_reduce(shared);
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = shared[static_cast<int64_t>(i)].item<int64_t>();
  return agree_on_control(requests, counts, world);
}

AgreedControl agree_on_control(const std::vector<ControlRequest>& requests, const ControlCounts& world_counts,
                               parallel::ProcessGroup& world) {
  AgreedControl agreed;
  agreed.stop = world_counts[static_cast<std::size_t>(ControlAction::kStop)] > 0;
  agreed.save = world_counts[static_cast<std::size_t>(ControlAction::kSave)] > 0;
  agreed.abort = world_counts[static_cast<std::size_t>(ControlAction::kAbort)] > 0;
  agreed.exit = world_counts[static_cast<std::size_t>(ControlAction::kExit)] > 0;
  if (!agreed.any()) return agreed;

  // Someone asked: gather everyone's descriptions.
  std::string mine;
  for (const ControlRequest& request : requests) mine += describe(request, world.global_ranks()[world.rank()]);
  for (const std::string& text : parallel::all_gather_strings(world, mine)) agreed.summary += text;
  return agreed;
}

}  // namespace callbacks
}  // namespace bridge::training
