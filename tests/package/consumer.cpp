// A user's program built against the installed package: includes the umbrella header, registers a class callback and
// a lambda, fires events over a real model, and exits non-zero if anything is off.
#include <bridge/bridge.h>

#include <cstdio>

using bridge::training::Callback;
using bridge::training::CallbackContext;
using bridge::training::CallbackManager;
using bridge::training::Event;

class StepCounter : public Callback {
 public:
  void on_train_step_end(CallbackContext& ctx) override { ++ctx.user_state.get_or_insert("steps", 0); }
};

int main() {
  bridge::training::GlobalState state;
  bridge::training::ModelChunks model{torch::nn::Linear(2, 2).ptr()};
  CallbackManager manager;
  manager.add(std::make_shared<StepCounter>());
  manager.register_callback("on_train_end", [](CallbackContext& ctx) { ctx.request_stop("done"); });
  for (int i = 0; i < 3; ++i) {
    CallbackContext ctx(state, model, manager.user_state());
    manager.fire(Event::kTrainStepEnd, ctx);
  }
  CallbackContext ctx(state, model, manager.user_state());
  manager.fire(Event::kTrainEnd, ctx);
  const bool ok = manager.user_state().get<int>("steps") == 3 &&
                  manager.control().pending(bridge::training::ControlAction::kStop) &&
                  !manager.has_callbacks(Event::kEvalEnd);
  std::printf("consumer: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
