// The training state that callbacks observe: Megatron-Bridge's GlobalState and TrainState, reduced to what the
// callback core and the pretraining loop need.
#pragma once

#include <cstdint>
#include <memory>

namespace bridge::models::moe {
struct MoEReport;
}

namespace bridge::training {

/// Progress counters of a run (Megatron's TrainState). `step` is the number of completed steps: during
/// on_train_step_start/end it is the 0-based index of the step in flight.
struct TrainState {
  std::int64_t step = 0;
  std::int64_t consumed_train_samples = 0;
  std::int64_t skipped_train_samples = 0;
  std::int64_t consumed_valid_samples = 0;
  double floating_point_operations_so_far = 0.0;
  bool do_train = false;
  bool do_valid = false;
  bool do_test = false;
};

struct ConfigContainer;

/// Everything the loop owns and callbacks may look at.
struct GlobalState {
  TrainState train_state;
  /// The run's validated configuration (set by pretrain(); include "training/config/config.h" to read it).
  const ConfigContainer* cfg = nullptr;
  /// An MoE model's last training step: its auxiliary losses, and each layer's tokens per expert and dropped tokens
  /// over the whole job (include "bridge/models/moe/moe_logging.h" to read it); null for a dense model until then.
  std::shared_ptr<const models::moe::MoEReport> moe_report;
};

}  // namespace bridge::training
