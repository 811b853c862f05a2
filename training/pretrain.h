// pretrain(config, step_fn, callbacks): Megatron-style GPT pretraining with tensor, pipeline and data parallelism,
// every lifecycle event reaching the callbacks.
//
// pretrain() initialises the world from the launcher (torchrun, mpirun, srun or none) unless the caller already did,
// builds the parallel groups, the model chunks, the optimizer and scheduler, adds config.callbacks (the recipe's
// built-in callbacks) after the caller's, fires on_data_init_start, builds the data, trains for train.train_iters
// steps with evaluation every train.eval_interval, then validates and tests. It returns the final TrainState; an
// abort requested by a callback, or any failure, throws (after on_exception).
//
//   auto manager = std::make_shared<CallbackManager>();
//   manager->register_callback(Event::kTrainStepEnd, [](CallbackContext& ctx) {
//     if (!ctx.loss_dict->empty()) std::cout << ctx.loss_dict->at("lm loss").item<double>() << "\n";
//   });
//   pretrain(config, gpt_forward_step, manager);
#pragma once

#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "training/callbacks/callback_manager.h"
#include "training/config/config.h"
#include "training/forward_step.h"
#include "training/state.h"

namespace bridge::training {

/// The callbacks argument of pretrain(): nothing, a list of Callback objects, or a manager.
class Callbacks {
 public:
  Callbacks() = default;
  Callbacks(std::nullptr_t) {}  // NOLINT(google-explicit-constructor): pretrain(config, fn, nullptr)
  Callbacks(std::shared_ptr<CallbackManager> manager)  // NOLINT(google-explicit-constructor)
      : manager_(normalize_callbacks(std::move(manager))) {}
  /// A manager the caller owns: pretrain(config, fn, manager) with `CallbackManager manager;` (it must outlive the
  /// call, as a local in the caller does).
  Callbacks(CallbackManager& manager)  // NOLINT(google-explicit-constructor)
      : manager_(std::shared_ptr<CallbackManager>(std::shared_ptr<CallbackManager>(), &manager)) {}
  Callbacks(const std::vector<std::shared_ptr<Callback>>& callbacks)  // NOLINT(google-explicit-constructor)
      : manager_(normalize_callbacks(callbacks)) {}
  Callbacks(std::initializer_list<std::shared_ptr<Callback>> callbacks)  // NOLINT(google-explicit-constructor)
      : Callbacks(std::vector<std::shared_ptr<Callback>>(callbacks)) {}
  const std::shared_ptr<CallbackManager>& manager() const { return manager_; }

 private:
  std::shared_ptr<CallbackManager> manager_;
};

/// A callback asked to abort (ctx.request_abort); the message names the callback, the rank and the reason.
class TrainingAborted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The loop behind pretrain(), with the step function already normalised.
TrainState run_pretrain(const ConfigContainer& config, ForwardStepFn step_fn,
                        std::shared_ptr<CallbackManager> callbacks);

/// Trains a GPT as `config` describes; see the top of this file.
template <class StepFn>
TrainState pretrain(const ConfigContainer& config, StepFn&& step_fn, const Callbacks& callbacks = {}) {
  return run_pretrain(config, make_forward_step(std::forward<StepFn>(step_fn)), callbacks.manager());
}

}  // namespace bridge::training
