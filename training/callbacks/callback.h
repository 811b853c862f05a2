// Callback: the base class for class-style callbacks. Override the events you need; the rest stay no-ops and are
// not even registered, so an unused event costs nothing.
//
//   class Timing : public bridge::training::Callback {
//    public:
//     void on_train_start(CallbackContext& ctx) override {
//       ctx.user_state.set("start", std::chrono::steady_clock::now());
//     }
//     void on_train_end(CallbackContext& ctx) override { ... }
//   };
//   manager.add(std::make_shared<Timing>());
//
// A callback with state that must survive a restart (a best loss, a counter) overrides state_dict() and
// load_state_dict(), Composer's and Lightning's contract: checkpoints save it under state_key() and a resumed run
// hands it back before on_checkpoint_load.
//
//   StateDict state_dict() const override { return {{"best", best_}}; }
//   void load_state_dict(const StateDict& state) override { best_ = state.at("best").toDouble(); }
#pragma once

#include <ATen/core/ivalue.h>

#include <map>
#include <string>

#include "training/callbacks/callback_context.h"
#include "training/callbacks/event.h"

namespace bridge::training {
inline namespace callbacks {

/// A callback's saved state: numbers, bool, string, tensor, and lists and string-keyed dicts of those (what PyTorch's
/// weights-only loader opens).
using StateDict = std::map<std::string, c10::IValue>;

class Callback {
 public:
  virtual ~Callback() = default;

  /// Shown in errors and control-request logs. Defaults to the class name without namespaces.
  virtual std::string name() const;

  /// The key this callback's state is saved under in checkpoints; defaults to name(). Two stateful callbacks in one
  /// manager must have different keys (Lightning's rule): give each instance its own key when a class is added twice.
  virtual std::string state_key() const;
  /// The state to save; empty by default.
  virtual StateDict state_dict() const;
  /// Restores what state_dict() returned in the run that saved the checkpoint. Values come back as saved, except that
  /// a 0-dim float64 tensor comes back as a float (the files store floats that way; see utils/torch_pickle.h).
  virtual void load_state_dict(const StateDict& state);
  /// Whether this object's class overrides state_dict or load_state_dict.
  bool stateful() const;

  // One handler per event; each is a no-op unless overridden. They are defined out of line so that every shared
  // library sees the same base functions, which override detection compares against.

  virtual void on_setup_start(CallbackContext& ctx);
  virtual void on_data_init_start(CallbackContext& ctx);
  virtual void on_train_start(CallbackContext& ctx);
  virtual void on_train_step_start(CallbackContext& ctx);
  virtual void on_train_step_end(CallbackContext& ctx);
  virtual void on_train_end(CallbackContext& ctx);
  virtual void on_eval_start(CallbackContext& ctx);
  virtual void on_eval_step_start(CallbackContext& ctx);
  virtual void on_eval_step_end(CallbackContext& ctx);
  virtual void on_eval_end(CallbackContext& ctx);
  virtual void on_test_start(CallbackContext& ctx);
  virtual void on_test_step_start(CallbackContext& ctx);
  virtual void on_test_step_end(CallbackContext& ctx);
  virtual void on_test_end(CallbackContext& ctx);
  virtual void on_checkpoint_save(CallbackContext& ctx);
  virtual void on_forward_start(CallbackContext& ctx);
  virtual void on_forward_end(CallbackContext& ctx);
  virtual void on_backward_start(CallbackContext& ctx);
  virtual void on_backward_end(CallbackContext& ctx);
  virtual void on_optimizer_step_start(CallbackContext& ctx);
  virtual void on_optimizer_step_end(CallbackContext& ctx);
  virtual void on_log(CallbackContext& ctx);
  virtual void on_checkpoint_load(CallbackContext& ctx);
  virtual void on_exception(CallbackContext& ctx);

  using Method = void (Callback::*)(CallbackContext&);
  /// The member function that handles `event`.
  static Method method_for(Event event);
  /// Whether this object's class (or an intermediate base) overrides the handler of `event`.
  bool overrides(Event event) const;
};

}  // namespace callbacks
}  // namespace bridge::training
