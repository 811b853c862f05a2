// Control requests: how a callback asks the loop to stop, save a checkpoint or abort.
//
// A callback calls ctx.request_stop("reason") (or request_save / request_abort); the request is recorded with the
// callback's name and the event. Requests persist in the CallbackManager until the loop takes them at a step
// boundary, where it agrees on them across ranks so that every rank acts on the same step. A request made before
// training starts is kept, not cleared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "training/callbacks/event.h"

namespace bridge::training {
inline namespace callbacks {

enum class ControlAction : std::uint8_t {
  kStop,   ///< Finish the current step, run on_train_end, return normally.
  kSave,   ///< Save a checkpoint at the end of the current step.
  kAbort,  ///< Stop now and make pretrain() fail with the reason.
  /// Save and leave training without on_train_end or the evaluation after it, as Megatron-Bridge exits on
  /// train.exit_signal_handler, exit_interval and exit_duration_in_mins (the loop asks for these itself).
  kExit,
};

/// How many ControlAction values there are: the length of the per-action counts the ranks agree on.
inline constexpr std::size_t kNumControlActions = 4;
static_assert(kNumControlActions == static_cast<std::size_t>(ControlAction::kExit) + 1,
              "kNumControlActions must count every ControlAction");

std::string_view to_string(ControlAction action);

struct ControlRequest {
  ControlAction action;
  std::string reason;
  std::string callback;  ///< Name of the callback that asked (or the train.* setting, for kExit).
  Event event;           ///< Event during which it asked.
};

class TrainingControl {
 public:
  void request(ControlAction action, std::string reason, std::string callback, Event event);

  /// Whether a request for `action` is pending.
  bool pending(ControlAction action) const;
  bool empty() const { return requests_.empty(); }
  /// Pending requests, oldest first.
  const std::vector<ControlRequest>& requests() const { return requests_; }
  /// Removes and returns the pending requests: the loop calls this once it has acted on them.
  std::vector<ControlRequest> take();

 private:
  std::vector<ControlRequest> requests_;
};

}  // namespace callbacks
}  // namespace bridge::training
