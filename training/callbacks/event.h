// The lifecycle events of the training loop, and their validated names.
//
// The first 15 are Megatron's events under their exact names: Megatron-Bridge's 14 and on_setup_start, which
// Megatron-LM's newer callback API (megatron/training/callbacks.py) fires before anything is built. The rest fill the
// gaps that users of Composer, Lightning and HF Trainer rely on: per-micro-batch forward/backward, the optimizer step,
// the log line, checkpoint loading, and a last word before an exception ends training.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace bridge::training {
inline namespace callbacks {

enum class Event : std::uint8_t {
  // Megatron-Bridge events (with Megatron-LM's on_setup_start).
  kSetupStart,      ///< pretrain() is starting: no world, groups or model yet; state.cfg is the config as passed.
  kDataInitStart,   ///< Model, optimizer and scheduler built, before the data iterators.
  kTrainStart,      ///< After model.train(), before the first step.
  kTrainStepStart,  ///< Start of each training step; train_state.step is the 0-based step in flight.
  kTrainStepEnd,    ///< After the optimizer step, before train_state.step is incremented.
  kTrainEnd,        ///< The loop completed normally (or stopped on request).
  kEvalStart,       ///< After model.eval(), before the first eval step.
  kEvalStepStart,
  kEvalStepEnd,
  kEvalEnd,  ///< Still in eval mode, with total_loss_dict.
  kTestStart,
  kTestStepStart,
  kTestStepEnd,
  kTestEnd,
  kCheckpointSave,  ///< After a checkpoint is fully written.
  // Extensions.
  kForwardStart,        ///< Per micro-batch and model chunk of a training step, before its forward pass.
  kForwardEnd,          ///< Per micro-batch and model chunk of a training step, with its output.
  kBackwardStart,       ///< Per micro-batch and model chunk, before its backward pass.
  kBackwardEnd,         ///< Per micro-batch and model chunk, after its backward pass.
  kOptimizerStepStart,  ///< Gradients final, reduced and clipped, before the update; grad_norm is set.
  kOptimizerStepEnd,    ///< After the parameter update.
  kLog,                 ///< Before the log line is written; callbacks may add metrics and text to ctx.log.
  kCheckpointLoad,      ///< After a checkpoint was loaded.
  kException,           ///< Training is about to fail with ctx.exception; flush what must not be lost.
};

inline constexpr std::size_t kNumEvents = static_cast<std::size_t>(Event::kException) + 1;

/// Every event, in declaration order.
const std::array<Event, kNumEvents>& all_events();

/// The event's registration name, e.g. "on_train_step_end".
std::string_view to_string(Event event);

/// The event named `name`, or nothing if no event has that name.
std::optional<Event> parse_event(std::string_view name);

/// The event named `name`; throws std::invalid_argument starting "Unknown event '<name>'. Valid events: " that lists
/// the valid names and suggests the closest one.
Event event_from_name(std::string_view name);

/// The set of valid event names (immutable; sorted).
const std::set<std::string, std::less<>>& valid_events();

}  // namespace callbacks
}  // namespace bridge::training
