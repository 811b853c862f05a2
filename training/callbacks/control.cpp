// TrainingControl: the request queue behind ctx.request_stop/save/abort.
#include "training/callbacks/control.h"

#include <algorithm>
#include <utility>

namespace bridge::training {
inline namespace callbacks {

std::string_view to_string(ControlAction action) {
  switch (action) {
    case ControlAction::kStop:
      return "stop";
    case ControlAction::kSave:
      return "save";
    case ControlAction::kAbort:
      return "abort";
    case ControlAction::kExit:
      return "exit";
  }
  return "unknown";
}

void TrainingControl::request(ControlAction action, std::string reason, std::string callback, Event event) {
  requests_.push_back(ControlRequest{action, std::move(reason), std::move(callback), event});
}

bool TrainingControl::pending(ControlAction action) const {
  return std::any_of(requests_.begin(), requests_.end(),
                     [action](const ControlRequest& request) { return request.action == action; });
}

std::vector<ControlRequest> TrainingControl::take() { return std::exchange(requests_, {}); }

}  // namespace callbacks
}  // namespace bridge::training
