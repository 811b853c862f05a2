// Agreeing on control requests across ranks. A callback may ask to stop, save or abort on any one rank; at each step
// boundary every rank calls agree_on_control, and all of them leave knowing the same actions, which callbacks on
// which ranks asked, and why, so they act on the same step and none waits on a collective the others skipped.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/process_group.h"
#include "training/callbacks/control.h"

namespace bridge::training {
inline namespace callbacks {

/// Requests per ControlAction (indexed by its value).
using ControlCounts = std::array<int64_t, kNumControlActions>;

struct AgreedControl {
  bool stop = false;
  bool save = false;
  bool abort = false;
  bool exit = false;  ///< save and leave training (train.exit_*)
  /// One line per request on any rank: "rank 1: callback 'early_stop' asked to stop during on_train_step_end: ...".
  std::string summary;
  bool any() const { return stop || save || abort || exit; }
  /// Adds the requests agreed in `other` (an earlier agreement in the same step).
  void merge(const AgreedControl& other);
};

/// How many requests of each action (indexed by ControlAction) `requests` holds; summed over the world, these are
/// what every rank needs to agree.
ControlCounts count_requests(const std::vector<ControlRequest>& requests);

/// Takes this rank's pending requests from `control` (null: none) and shares them over `world`. One small
/// all-reduce when nobody asked; when someone did, two more collectives carry the descriptions.
AgreedControl agree_on_control(TrainingControl* control, parallel::ProcessGroup& world);

/// As above, with this rank's `requests` (taken from its TrainingControl) and `world_counts`, their count_requests()
/// already summed over `world` by a collective that carried other statistics too (the training log's). Collective
/// only when some count is non-zero.
AgreedControl agree_on_control(const std::vector<ControlRequest>& requests, const ControlCounts& world_counts,
                               parallel::ProcessGroup& world);

}  // namespace callbacks
}  // namespace bridge::training
